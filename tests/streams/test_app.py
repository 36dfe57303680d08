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


def test_faust_tables_are_logged_on_one_line() -> None:
    """Faust draws topic and partition sets as boxed tables (about 120 lines at a worker's
    start); through mode's formatter, as the worker logs, each is one line."""
    import logging

    import faust.worker  # noqa: F401  (registers Faust's table formatter)
    from faust.types import TP
    from mode.utils.logging import ExtensionFormatter

    from streams.runtime.quiet_logs import one_line_table, quiet_aiokafka_logs

    quiet_aiokafka_logs()
    assigned = {TP("app.events", p) for p in range(4)} | {TP("app.ticks", 0)}
    message = "Setting newly assigned partitions %s"
    record = logging.LogRecord("faust", logging.INFO, __file__, 1, message, (assigned,), None)
    text = ExtensionFormatter(fmt="%(message)s").format(record)  # as the worker's log lines
    assert text == (
        "Setting newly assigned partitions Topic Partition Set: app.events {0-3}; app.ticks {0}"
    )
    many = "\n".join(
        ["+T----+", "| topic | n |", "+---+---+", *(f"| t{n} | {n} |" for n in range(25)), "+--+"]
    )
    assert one_line_table(many) == (
        "T: " + "; ".join(f"t{n} {n}" for n in range(20)) + "; and 5 more"
    )
    assert one_line_table("no table here") is None
