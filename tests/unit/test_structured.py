"""Structured JSON CloudEvents: the store's fast path agrees with the full parser."""

from __future__ import annotations

import pytest

from streamapp import DecodeError, Event
from streamapp.codecs.structured import from_json, from_stored, to_json


@pytest.mark.parametrize(
    "event",
    [
        Event.create("order.paid", stream_id="o-1", data={"n": 1, "x": [1, "a"]}, version=3),
        Event.create("blob", stream_id="o-2", data=b"\x00\xffraw"),
        Event.create("empty", stream_id="o-3", extensions={"trace": "t-1"}),
    ],
)
def test_from_stored_equals_from_json(event: Event) -> None:
    payload = to_json(event)
    assert from_stored(payload) == from_json(payload) == event


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"not json", "not valid JSON"),
        (b'{"specversion":"1.0","id":"","source":"s","type":"t"}', "lacks required"),
        (b'{"specversion":"0.3","id":"i","source":"s","type":"t"}', "unsupported specversion"),
        (b'{"specversion":"1.0","source":"s","type":"t"}', "lacks required attribute(s): id"),
    ],
)
def test_from_stored_falls_back_to_the_full_check(payload: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        from_stored(payload)
