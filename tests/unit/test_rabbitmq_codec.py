"""RabbitMQ (AMQP 0-9-1) CloudEvents codec and wire mapping: round trips and bad input."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest

from streamapp import DecodeError, Event
from streamapp.codecs.amqp import decode, encode
from streamapp.transports.rabbitmq.wire import KEY_HEADER, from_message, to_message, to_properties

REQUIRED = [
    ("cloudEvents_id", b"evt-1"),
    ("cloudEvents_source", b"/tests"),
    ("cloudEvents_type", b"order.placed"),
    ("cloudEvents_specversion", b"1.0"),
]


def full_event(data: Any = None, datacontenttype: str | None = "application/json") -> Event:
    return Event(
        id="evt-1",
        source="/tests",
        type="order.placed",
        subject="subj",
        time="2024-05-06T07:08:09.123456+00:00",
        datacontenttype=datacontenttype,
        dataschema="https://example.com/schema.json",
        data=data,
        extensions={"streamid": "o-1", "streamversion": "3", "tenant": "acme"},
    )


def over_the_wire(event: Event) -> Event:
    """Encode, map to an AMQP message and back (as the broker hands it), decode."""
    key, body, headers = encode(event)
    message = to_message(body, key, headers)
    assert message.delivery_mode == 2  # persistent
    assert message.message_id
    got_key, value, got_headers = from_message(
        message.body, dict(message.headers), message.content_type
    )
    assert got_key == key
    return decode(value, got_headers)


@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        ({"total": 12.5, "items": [1, 2], "note": "é", "ok": True, "n": None}, "application/json"),
        (b"\x00\xff\xfe raw", "application/octet-stream"),
        (None, "application/json"),
        (None, None),
        ([1, 2], "application/vnd.acme+json; charset=utf-8"),
    ],
)
def test_round_trip_every_attribute_kind(data: Any, content_type: str | None) -> None:
    event = full_event(data, content_type)
    decoded = over_the_wire(event)
    assert dataclasses.asdict(decoded) == dataclasses.asdict(event)
    assert decoded.stream_id == "o-1"
    assert decoded.stream_version == 3


def test_headers_and_properties_follow_the_binding() -> None:
    event = full_event({"a": 1})
    key, body, headers = encode(event)
    message = to_message(body, key, headers)
    table = dict(message.headers)
    assert message.content_type == "application/json"  # the property, not a header
    assert "cloudEvents_datacontenttype" not in table
    assert table["cloudEvents_id"] == "evt-1"
    assert table["cloudEvents_subject"] == "subj"
    assert table["cloudEvents_time"] == "2024-05-06T07:08:09.123456+00:00"
    assert table["cloudEvents_dataschema"] == "https://example.com/schema.json"
    assert table["cloudEvents_tenant"] == "acme"
    assert table[KEY_HEADER] == "o-1"
    assert orjson.loads(message.body) == {"a": 1}


def test_the_sink_publishes_the_same_properties_as_the_message() -> None:
    key, body, headers = encode(full_event({"a": 1}))
    message = to_message(body, key, headers)
    props = to_properties(key, headers)
    assert props.headers == message.headers
    assert props.content_type == message.content_type == "application/json"
    assert props.delivery_mode == message.delivery_mode == 2  # persistent
    assert props.message_id
    assert props.message_id != to_properties(key, headers).message_id  # one per attempt


def test_minimal_event_and_binary_data_without_content_type() -> None:
    assert over_the_wire(Event(id="1", source="s", type="t")) == Event(id="1", source="s", type="t")
    blob = Event.create("blob", stream_id="s", data=b"\x01\x02", id="x", time="t")
    assert over_the_wire(blob) == blob


def test_colon_prefix_and_any_case_are_accepted() -> None:
    headers = [(n.replace("cloudEvents_", "cloudEvents:"), v) for n, v in REQUIRED]
    event = decode(b"[1]", [*headers, ("content-type", b"application/json")])
    assert (event.id, event.data) == ("evt-1", [1])
    event = decode(b"x", [(n.upper(), v) for n, v in REQUIRED])
    assert event.type == "order.placed"


def test_structured_body_is_accepted() -> None:
    body = orjson.dumps({"id": "1", "source": "s", "type": "t", "specversion": "1.0", "data": 7})
    event = decode(body, [("content-type", b"application/cloudevents+json")])
    assert (event.id, event.data) == ("1", 7)


@pytest.mark.parametrize("content_type", [None, "application/json"])
def test_a_json_body_with_specversion_and_no_headers_is_structured(
    content_type: str | None,
) -> None:
    body = orjson.dumps({"id": "1", "source": "s", "type": "t", "specversion": "1.0", "data": 7})
    message = to_message(body, None, [])  # no cloudEvents_ headers
    message.content_type = content_type
    _, value, headers = from_message(message.body, dict(message.headers), message.content_type)
    event = decode(value, headers)
    assert (event.id, event.data, event.datacontenttype) == ("1", 7, content_type)


def test_a_json_body_without_specversion_is_not_a_cloud_event() -> None:
    with pytest.raises(DecodeError, match="not a CloudEvent"):
        decode(b'{"id": "1", "source": "s", "type": "t"}', [])


def test_foreign_header_values_come_back_as_bytes() -> None:
    message = to_message(b"v", b"k", [("x-trace", b"\xff"), ("x-text", b"plain")])
    key, value, headers = from_message(message.body, dict(message.headers), None)
    assert (key, value) == (b"k", b"v")
    assert dict(headers) == {"x-trace": b"\xff", "x-text": b"plain"}
    _, _, typed = from_message(b"", {"n": 5, "b": True, "none": None}, None)
    assert dict(typed) == {"n": b"5", "b": b"true", "none": b""}


def test_key_falls_back_to_the_stream_id_header() -> None:
    key, value, _ = from_message(b"", {"cloudEvents_streamid": "o-9"}, None)
    assert (key, value) == (b"o-9", None)
    key, _, _ = from_message(b"", {"cloudEvents_subject": "s-1"}, None)
    assert key == b"s-1"


@pytest.mark.parametrize(
    ("body", "headers", "reason"),
    [
        (b"plain", [("x-trace", b"\xff")], "not a CloudEvent"),
        (b"x", REQUIRED[:3], "lacks required attribute(s): specversion"),
        (b"x", [*REQUIRED[:3], ("cloudEvents_specversion", b"0.3")], "unsupported specversion"),
        (b"x", [*REQUIRED, ("cloudEvents_id", b"\xff")], "not valid UTF-8"),
        (b"x", [*REQUIRED, ("CLOUDEVENTS:TENANT", b"\xff")], "'CLOUDEVENTS:TENANT' is not valid"),
        (b"x", [*REQUIRED, ("content-type", b"\xff")], "'content-type' is not valid UTF-8"),
        (b"x", [*REQUIRED, ("cloudEvents_tenant", None)], "'cloudEvents_tenant' has no value"),
        (b"x", [*REQUIRED, ("cloudEvents_streamversion", b"-1")], "not a positive integer"),
        (b"x", [*REQUIRED, ("cloudEvents_", b"v")], "names no attribute"),
        (b"", [("content-type", b"application/cloudevents+json")], "empty body"),
        (b"<x/>", [("content-type", b"application/cloudevents+xml")], "only JSON"),
        (b"[1]", [("content-type", b"application/cloudevents+json")], "not a JSON object"),
    ],
)
def test_decode_failures_are_decode_errors_with_a_reason(
    body: bytes, headers: list[tuple[str, bytes]], reason: str
) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(body, headers)
    assert reason in caught.value.reason


def test_json_data_is_read_when_first_asked_and_bad_json_is_a_data_error_there() -> None:
    """As on Kafka: the attributes decode up front, the body when the handler first
    reads ``data`` (once); a body that is not JSON raises DataError there, every time."""
    from streamapp import DataError

    headers = [*REQUIRED, ("content-type", b"application/json")]
    event = decode(b'{"n": 1}', headers)
    assert event.data == {"n": 1}
    assert event.data is event.data
    bad = decode(b"{not json", headers)
    for _ in range(2):
        with pytest.raises(DataError, match="not valid JSON"):
            _ = bad.data
