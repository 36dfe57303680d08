"""Output ids and encodings (`schemas.outputs`)."""

from __future__ import annotations

import msgpack
import pytest

from schemas.outputs import encode_output, episode_id, id_part, prediction_id


@pytest.mark.parametrize(
    ("text", "escaped"),
    [
        ("user-1", "user-1"),
        ("", ""),
        ("a:b", "a%3Ab"),
        ("50%", "50%25"),
        ("#3", "%233"),
        ("x/y", "x%2Fy"),
        ("%3A:#/", "%253A%3A%23%2F"),
        ("é:ü", "é%3Aü"),
    ],
)
def test_id_parts_escape_exactly_the_separators(text, escaped):
    assert id_part(text) == escaped


def test_ids_of_users_and_events_with_separators_stay_apart():
    assert prediction_id("a:b", "c", 1) != prediction_id("a", "b:c", 1)
    assert prediction_id("u", None, 3) == "u:#3" != prediction_id("u", "#3", 3)
    assert episode_id("u/1", 5, 2) == "u%2F1:5/2"


def test_msgpack_outputs_are_msgpacks_own_bytes_call_after_call():
    """The shared packer gives what `msgpack.packb` gives, also after a value it refused."""
    message = {"id": "u:e1", "at": 1, "intents": {"up": {"p": 0.5, "reveal": False}}}
    assert encode_output(message) == msgpack.packb(message)
    with pytest.raises(TypeError):
        encode_output({"bad": object()})
    assert encode_output(message) == msgpack.packb(message)
