"""The worker's Faust app (`streams.runtime.app`): what it adds around the batch commit."""

from __future__ import annotations


def test_a_retriable_coordinator_error_is_logged_as_info():
    import logging

    from aiokafka.errors import GroupAuthorizationFailedError, GroupCoordinatorNotAvailableError

    from streams.runtime.quiet_logs import _TransientCoordinatorErrors

    def record(err: Exception) -> logging.LogRecord:
        return logging.LogRecord(
            "aiokafka.consumer.group_coordinator",
            logging.ERROR,
            __file__,
            1,
            "Group Coordinator Request failed: %s",
            (err,),
            None,
        )

    quiet = _TransientCoordinatorErrors()
    transient = record(GroupCoordinatorNotAvailableError())
    assert quiet.filter(transient) and transient.levelname == "INFO"
    assert transient.getMessage().endswith("(retrying)")
    fatal = record(GroupAuthorizationFailedError())
    assert quiet.filter(fatal) and fatal.levelname == "ERROR"
