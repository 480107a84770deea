"""Kafka CloudEvents codec: binary and structured modes, SDK interop, bad input, fuzzing."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

import orjson
import pytest
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from cloudevents.v1 import kafka as v1_kafka
from cloudevents.v1.http import CloudEvent as V1CloudEvent
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamapp import DataError, DecodeError, Event
from streamapp.codecs.kafka import decode, encode, encode_structured
from streamapp.events import CORE

REQUIRED_HEADERS = [
    ("ce_id", b"evt-1"),
    ("ce_source", b"/tests"),
    ("ce_type", b"order.placed"),
    ("ce_specversion", b"1.0"),
]
STRUCTURED_CT = [("content-type", b"application/cloudevents+json")]


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


def structured(body: Any) -> Event:
    return decode(None, orjson.dumps(body), STRUCTURED_CT)


# --- binary mode -------------------------------------------------------------------


def test_binary_round_trip_all_attributes_and_json_data() -> None:
    event = full_event({"total": 12.5, "items": [1, 2], "note": "é", "ok": True, "n": None})
    key, value, headers = encode(event)
    assert key == b"o-1"
    names = dict(headers)
    assert names["content-type"] == b"application/json"
    assert "ce_datacontenttype" not in names
    assert names["ce_streamid"] == b"o-1"
    assert names["ce_tenant"] == b"acme"
    decoded = decode(key, value, headers)
    assert decoded == event
    assert dataclasses.asdict(decoded) == dataclasses.asdict(event)
    assert decoded.stream_id == "o-1"
    assert decoded.stream_version == 3


def test_binary_round_trip_bytes_data() -> None:
    event = full_event(b"\x00\xff\xfe raw", datacontenttype="application/octet-stream")
    key, value, headers = encode(event)
    assert value == b"\x00\xff\xfe raw"
    assert decode(key, value, headers) == event


def test_binary_round_trip_bytes_data_without_content_type() -> None:
    event = Event.create("blob", stream_id="s", data=b"\x01\x02", id="x", time="t")
    assert event.datacontenttype is None
    key, value, headers = encode(event)
    assert all(name != "content-type" for name, _ in headers)
    assert decode(key, value, headers) == event


def test_binary_round_trip_no_data_is_null_value() -> None:
    event = full_event(None)
    key, value, headers = encode(event)
    assert value is None
    decoded = decode(key, value, headers)
    assert decoded.data is None
    assert decoded == event


def test_binary_round_trip_minimal_event() -> None:
    event = Event(id="1", source="s", type="t")
    key, value, headers = encode(event)
    assert key is None
    assert decode(key, value, headers) == event


def test_json_content_type_with_parameters_and_suffix_is_parsed() -> None:
    for ct in ("application/json; charset=utf-8", "application/vnd.acme+json", "text/json"):
        event = decode(None, b'{"a": [1]}', [*REQUIRED_HEADERS, ("content-type", ct.encode())])
        assert event.data == {"a": [1]}
        assert event.datacontenttype == ct


def test_non_json_content_type_keeps_bytes() -> None:
    event = decode(None, b"hello", [*REQUIRED_HEADERS, ("content-type", b"text/plain")])
    assert event.data == b"hello"
    assert event.datacontenttype == "text/plain"


def test_header_names_are_case_insensitive() -> None:
    headers = [(n.upper(), v) for n, v in REQUIRED_HEADERS] + [
        ("Content-Type", b"application/json")
    ]
    event = decode(None, b"[1]", headers)
    assert (event.id, event.source, event.type, event.data) == (
        "evt-1",
        "/tests",
        "order.placed",
        [1],
    )


def test_encode_refuses_structured_data_without_json_content_type() -> None:
    event = Event(id="1", source="s", type="t", data={"a": 1})
    with pytest.raises(TypeError, match="JSON"):
        encode(event)


# --- the record key ----------------------------------------------------------------


def test_record_key_is_never_injected() -> None:
    event = decode(b"some-key", b"{}", [*REQUIRED_HEADERS, ("content-type", b"application/json")])
    assert event.extensions == {}
    assert "partitionkey" not in event.attributes()
    assert event.stream_id is None
    assert event.subject is None


def test_record_key_does_not_override_streamid() -> None:
    event = decode(b"other", None, [*REQUIRED_HEADERS, ("ce_streamid", b"o-9")])
    assert event.stream_id == "o-9"
    assert event.extensions == {"streamid": "o-9"}


def test_structured_record_key_is_not_injected() -> None:
    body = {"id": "1", "source": "s", "type": "t", "specversion": "1.0"}
    event = decode(b"k", orjson.dumps(body), STRUCTURED_CT)
    assert event.extensions == {}
    assert event.stream_id is None


# --- structured mode ---------------------------------------------------------------


def test_structured_json_data() -> None:
    body = {
        "id": "1",
        "source": "s",
        "type": "t",
        "specversion": "1.0",
        "subject": "o-1",
        "datacontenttype": "application/json",
        "streamversion": 4,
        "flag": True,
        "data": {"x": [1, 2, {"y": None}]},
    }
    event = structured(body)
    assert event.data == {"x": [1, 2, {"y": None}]}
    assert event.subject == "o-1"
    assert event.stream_id == "o-1"
    assert event.datacontenttype == "application/json"
    assert event.extensions == {"streamversion": "4", "flag": "true"}
    assert event.stream_version == 4


def test_structured_data_base64() -> None:
    raw = b"\x00\x01binary\xff"
    body = {"id": "1", "source": "s", "type": "t", "specversion": "1.0"}
    event = structured({**body, "data_base64": base64.b64encode(raw).decode()})
    assert event.data == raw
    assert "data_base64" not in event.extensions


def test_structured_content_type_with_charset() -> None:
    body = {"id": "1", "source": "s", "type": "t", "specversion": "1.0", "data": [1]}
    ct = [("content-type", b"application/cloudevents+json; charset=utf-8")]
    assert decode(None, orjson.dumps(body), ct).data == [1]


def test_encode_structured_round_trip_json_and_bytes() -> None:
    for event in (
        full_event({"a": 1}),
        full_event(b"\x00\x01", datacontenttype="application/octet-stream"),
        full_event(None),
    ):
        key, value, headers = encode_structured(event)
        assert key == b"o-1"
        assert decode(key, value, headers) == event


def test_structured_wins_over_ce_headers() -> None:
    body = {"id": "from-body", "source": "s", "type": "t", "specversion": "1.0"}
    headers = [*REQUIRED_HEADERS, *STRUCTURED_CT]
    assert decode(None, orjson.dumps(body), headers).id == "from-body"


# --- interop with the official CloudEvents SDK 2.x ---------------------------------


def to_aiokafka(message: ce_kafka.KafkaMessage) -> tuple[bytes | None, bytes, list]:
    key = message.key.encode() if isinstance(message.key, str) else message.key
    return key, message.value, list(message.headers.items())


def sdk_event(data: Any, datacontenttype: str | None) -> CloudEvent:
    attributes: dict[str, Any] = {
        "id": "sdk-1",
        "source": "/sdk",
        "type": "com.example.test",
        "subject": "o-7",
        "streamversion": "2",
        "tenant": "acme",
    }
    if datacontenttype is not None:
        attributes["datacontenttype"] = datacontenttype
    return CloudEvent(attributes=attributes, data=data)


def test_sdk_binary_to_our_decode() -> None:
    ce = sdk_event({"message": "Hello", "n": [1, 2]}, "application/json")
    key, value, headers = to_aiokafka(ce_kafka.to_binary(ce, JSONFormat()))
    assert all(isinstance(n, str) and isinstance(v, bytes) for n, v in headers)
    event = decode(key, value, headers)
    assert event.id == "sdk-1"
    assert event.source == "/sdk"
    assert event.type == "com.example.test"
    assert event.specversion == "1.0"
    assert event.subject == "o-7"
    assert event.stream_id == "o-7"
    assert event.stream_version == 2
    assert event.extensions == {"streamversion": "2", "tenant": "acme"}
    assert event.datacontenttype == "application/json"
    assert event.data == {"message": "Hello", "n": [1, 2]}
    assert event.time is not None
    assert event.time.startswith(str(ce.get_time().date()))


def test_sdk_binary_bytes_data_to_our_decode() -> None:
    ce = sdk_event(b"\x00\xffraw", "application/octet-stream")
    event = decode(*to_aiokafka(ce_kafka.to_binary(ce, JSONFormat())))
    assert event.data == b"\x00\xffraw"
    assert event.datacontenttype == "application/octet-stream"


def test_sdk_structured_to_our_decode() -> None:
    ce = sdk_event({"message": "Hello"}, "application/json")
    event = decode(*to_aiokafka(ce_kafka.to_structured(ce, JSONFormat())))
    assert event.id == "sdk-1"
    assert event.data == {"message": "Hello"}
    assert event.extensions == {"streamversion": "2", "tenant": "acme"}
    assert event.stream_version == 2


def test_sdk_structured_base64_to_our_decode() -> None:
    ce = sdk_event(b"\x01\x02\x03", "application/octet-stream")
    message = ce_kafka.to_structured(ce, JSONFormat())
    assert b"data_base64" in message.value
    assert decode(*to_aiokafka(message)).data == b"\x01\x02\x03"


def test_sdk_binary_without_data_to_our_decode() -> None:
    ce = sdk_event(None, "application/json")
    message = ce_kafka.to_binary(ce, JSONFormat())
    assert message.value == b""
    event = decode(*to_aiokafka(message))
    assert event.id == "sdk-1"
    assert event.data is None


def test_our_encode_to_sdk_from_binary() -> None:
    event = full_event({"total": 3, "lines": ["a"]})
    key, value, headers = encode(event)
    message = ce_kafka.KafkaMessage(headers=dict(headers), key=key, value=value)  # type: ignore[arg-type]
    ce = ce_kafka.from_binary(message, JSONFormat())
    assert ce.get_id() == event.id
    assert ce.get_source() == event.source
    assert ce.get_type() == event.type
    assert ce.get_specversion() == "1.0"
    assert ce.get_subject() == event.subject
    assert ce.get_dataschema() == event.dataschema
    assert ce.get_datacontenttype() == "application/json"
    assert ce.get_time() is not None
    assert ce.get_time().isoformat() == event.time
    assert ce.get_extension("streamid") == "o-1"
    assert ce.get_extension("streamversion") == "3"
    assert ce.get_extension("tenant") == "acme"
    assert ce.get_data() == {"total": 3, "lines": ["a"]}


def test_our_encode_structured_to_sdk_from_structured() -> None:
    event = full_event(b"\x00bin", datacontenttype="application/octet-stream")
    _key, value, headers = encode_structured(event)
    message = ce_kafka.KafkaMessage(headers=dict(headers), key=None, value=value)
    ce = ce_kafka.from_structured(message, JSONFormat())
    assert ce.get_id() == event.id
    assert ce.get_data() == b"\x00bin"
    assert ce.get_extension("streamid") == "o-1"


def v1_event(data: Any, datacontenttype: str | None) -> Any:
    attributes = {"id": "v1-1", "source": "/sdk/v1", "type": "t", "subject": "o-8"}
    if datacontenttype is not None:
        attributes["datacontenttype"] = datacontenttype
    attributes["streamversion"] = "4"
    return V1CloudEvent(attributes, data)


def test_sdk_v1_structured_without_content_type_to_our_decode() -> None:
    message = v1_kafka.to_structured(v1_event({"n": 1}, None))
    assert message.headers == {}  # the SDK writes no content-type at all
    event = decode(*to_aiokafka(message))  # type: ignore[arg-type]
    assert (event.id, event.stream_id, event.stream_version) == ("v1-1", "o-8", 4)
    assert event.data == {"n": 1}
    assert event.datacontenttype is None


def test_sdk_v1_structured_with_datacontenttype_to_our_decode() -> None:
    message = v1_kafka.to_structured(v1_event({"n": 2}, "application/json"))
    assert message.headers == {"content-type": b"application/json"}  # moved out of the JSON
    event = decode(*to_aiokafka(message))  # type: ignore[arg-type]
    assert (event.id, event.data, event.datacontenttype) == ("v1-1", {"n": 2}, "application/json")


def test_sdk_v1_binary_to_our_decode() -> None:
    message = v1_kafka.to_binary(v1_event({"n": 3}, "application/json"))
    event = decode(*to_aiokafka(message))  # type: ignore[arg-type]
    assert (event.id, event.data, event.stream_version) == ("v1-1", {"n": 3}, 4)


def test_sniffed_structured_event_keeps_its_own_datacontenttype() -> None:
    body = {"id": "1", "source": "s", "type": "t", "specversion": "1.0"}
    body |= {"datacontenttype": "application/vnd.x+json", "data": [1]}
    event = decode(None, b"  " + orjson.dumps(body), [("content-type", b"text/plain")])
    assert (event.datacontenttype, event.data) == ("application/vnd.x+json", [1])


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b'{"id": "1", "source": "s", "type": "t"}', "not a CloudEvent"),  # no specversion
        (b'["specversion"]', "not a CloudEvent"),
        (b'{"specversion": "1.0"', "not a CloudEvent"),  # not JSON
        (b'{"specversion": "1.0", "id": "1"}', "lacks required attribute(s): source, type"),
        (b'{"specversion": "0.3", "id": "1", "source": "s", "type": "t"}', "specversion"),
    ],
)
def test_sniffing_without_headers_gives_a_reason(value: bytes, reason: str) -> None:
    assert reason in decode_error(None, value, [])


# --- bad input: DecodeError with a reason, never another exception ----------------


def decode_error(key: bytes | None, value: bytes | None, headers: list) -> str:
    with pytest.raises(DecodeError) as info:
        decode(key, value, headers)
    assert info.value.reason
    assert str(info.value) == info.value.reason
    return info.value.reason


def test_no_ce_headers() -> None:
    reason = decode_error(None, b"{}", [("content-type", b"application/json"), ("trace", b"x")])
    assert "ce_" in reason


def test_no_headers_at_all() -> None:
    assert "not a CloudEvent" in decode_error(b"k", b"v", [])


@pytest.mark.parametrize("missing", ["id", "source", "type", "specversion"])
def test_binary_missing_required_attribute(missing: str) -> None:
    headers = [(n, v) for n, v in REQUIRED_HEADERS if n != "ce_" + missing]
    reason = decode_error(None, None, headers)
    assert "required" in reason
    assert missing in reason


@pytest.mark.parametrize("missing", ["id", "source", "type", "specversion"])
def test_binary_empty_required_attribute(missing: str) -> None:
    headers = [(n, b"" if n == "ce_" + missing else v) for n, v in REQUIRED_HEADERS]
    assert missing in decode_error(None, None, headers)


@pytest.mark.parametrize("missing", ["id", "source", "type", "specversion"])
def test_structured_missing_required_attribute(missing: str) -> None:
    body = {"id": "1", "source": "s", "type": "t", "specversion": "1.0"}
    del body[missing]
    reason = decode_error(None, orjson.dumps(body), STRUCTURED_CT)
    assert missing in reason


@pytest.mark.parametrize("version", [b"0.3", b"2.0", b"1", b"1.0 "])
def test_wrong_specversion(version: bytes) -> None:
    headers = [*REQUIRED_HEADERS[:3], ("ce_specversion", version)]
    assert "specversion" in decode_error(None, None, headers)


def test_structured_wrong_specversion() -> None:
    body = {"id": "1", "source": "s", "type": "t", "specversion": "0.3"}
    assert "specversion" in decode_error(None, orjson.dumps(body), STRUCTURED_CT)


def test_non_utf8_ce_header() -> None:
    reason = decode_error(None, None, [*REQUIRED_HEADERS, ("ce_subject", b"\xff\xfe")])
    assert "ce_subject" in reason
    assert "UTF-8" in reason


def test_non_utf8_content_type_header() -> None:
    reason = decode_error(None, b"{}", [*REQUIRED_HEADERS, ("content-type", b"\xc3\x28")])
    assert "content-type" in reason


def test_ce_header_without_value() -> None:
    assert "ce_subject" in decode_error(None, None, [*REQUIRED_HEADERS, ("ce_subject", None)])


def test_foreign_binary_header_is_ignored() -> None:
    headers = [
        ("traceparent-bin", b"\xff\x00\xfe\x80"),
        *REQUIRED_HEADERS,
        ("x-null", None),
        ("content-type", b"application/json"),
    ]
    event = decode(None, b'{"a": 1}', headers)
    assert event.data == {"a": 1}
    assert event.extensions == {}


def test_invalid_json_data_with_json_content_type_is_a_data_error_where_first_read() -> None:
    """The attributes decode up front; the data is parsed when first read: bad JSON
    raises DataError (a DecodeError: NOT_DELIVERABLE) there, each time, never before."""
    headers = [*REQUIRED_HEADERS, ("content-type", b"application/json")]
    event = decode(None, b"{not json", headers)
    assert event.id == "evt-1"
    for _ in range(2):
        with pytest.raises(DataError) as info:
            _ = event.data
        assert "JSON" in info.value.reason
        assert "application/json" in info.value.reason
    assert "not readable" in repr(event)  # a log line never raises
    assert event == decode(None, b"{not json", headers)  # nor does a comparison


def test_json_data_is_parsed_once_when_first_read() -> None:
    from streamapp.events import LazyEvent, data_unread, raw_data

    headers = [*REQUIRED_HEADERS, ("content-type", b"application/json")]
    event = decode(None, b'{"a": [1, 2]}', headers)
    assert isinstance(event, LazyEvent)
    assert data_unread(event)
    assert raw_data(event) == b'{"a": [1, 2]}'
    first = event.data
    assert first == {"a": [1, 2]}
    assert event.data is first  # read once: the value replaced the raw bytes
    assert not data_unread(event)
    plain = Event(
        id="evt-1",
        source="/tests",
        type="order.placed",
        data={"a": [1, 2]},
        datacontenttype="application/json",
    )
    assert event == plain
    assert plain == event


def test_structured_not_json() -> None:
    assert "JSON" in decode_error(None, b"<xml/>", STRUCTURED_CT)


def test_structured_not_utf8() -> None:
    assert "JSON" in decode_error(None, b'{"id": "\xff"}', STRUCTURED_CT)


@pytest.mark.parametrize("body", [[1, 2], "text", 3, None])
def test_structured_not_an_object(body: Any) -> None:
    assert "object" in decode_error(None, orjson.dumps(body), STRUCTURED_CT)


def test_structured_empty_value() -> None:
    assert "empty" in decode_error(None, None, STRUCTURED_CT)


def test_structured_non_json_format() -> None:
    reason = decode_error(None, b"x", [("content-type", b"application/cloudevents+avro")])
    assert "only JSON" in reason


def test_structured_bad_base64() -> None:
    body = {"id": "1", "source": "s", "type": "t", "specversion": "1.0", "data_base64": "!!"}
    assert "base64" in decode_error(None, orjson.dumps(body), STRUCTURED_CT)


@pytest.mark.parametrize("value", [{"a": 1}, [1], None])
def test_structured_attribute_not_scalar(value: Any) -> None:
    body = {"id": "1", "source": "s", "type": "t", "specversion": "1.0", "tenant": value}
    assert "tenant" in decode_error(None, orjson.dumps(body), STRUCTURED_CT)


@pytest.mark.parametrize("version", [b"0", b"-1", b"abc", b"1.5", b"", b" 2", b"+3"])
def test_streamversion_not_a_positive_integer(version: bytes) -> None:
    headers = [*REQUIRED_HEADERS, ("ce_streamversion", version)]
    assert "streamversion" in decode_error(None, None, headers)


@pytest.mark.parametrize("version", [0, -4, 2.5, True, "x"])
def test_structured_streamversion_not_a_positive_integer(version: Any) -> None:
    body = {"id": "1", "source": "s", "type": "t", "specversion": "1.0", "streamversion": version}
    assert "streamversion" in decode_error(None, orjson.dumps(body), STRUCTURED_CT)


def test_streamversion_unicode_digit_is_a_decode_error() -> None:
    headers = [*REQUIRED_HEADERS, ("ce_streamversion", "²".encode())]
    with pytest.raises(DecodeError, match="streamversion"):
        decode(None, None, headers)


# --- properties --------------------------------------------------------------------

EXT_NAMES = st.from_regex(r"[a-z0-9]{1,12}", fullmatch=True).filter(
    lambda n: n not in CORE and n not in ("data", "data_base64", "streamversion")
)
JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=12,
)
JSON_TYPES = st.sampled_from(
    [
        "application/json",
        "text/json",
        "application/vnd.acme+json",
        "application/json; charset=utf-8",
    ]
)


@st.composite
def events(draw: st.DrawFn) -> Event:
    extensions = draw(st.dictionaries(EXT_NAMES, st.text(), max_size=4))
    version = draw(st.none() | st.integers(min_value=1, max_value=2**63))
    if version is not None:
        extensions["streamversion"] = str(version)
    kind = draw(st.sampled_from(["json", "bytes", "none"]))
    if kind == "json":
        content_type: str | None = draw(JSON_TYPES)
        data: Any = draw(JSON)
    elif kind == "bytes":
        content_type = draw(st.none() | st.just("application/octet-stream"))
        data = draw(st.binary(min_size=1))  # an empty value means no data
    else:
        content_type = draw(st.none() | JSON_TYPES)
        data = None
    optional = st.none() | st.text()
    return Event(
        id=draw(st.text(min_size=1)),
        source=draw(st.text(min_size=1)),
        type=draw(st.text(min_size=1)),
        subject=draw(optional),
        time=draw(optional),
        datacontenttype=content_type,
        dataschema=draw(optional),
        data=data,
        extensions=extensions,
    )


@settings(max_examples=120, deadline=None, database=None)
@given(events())
def test_property_binary_round_trip(event: Event) -> None:
    key, value, headers = encode(event)
    decoded = decode(key, value, headers)
    assert dataclasses.asdict(decoded) == dataclasses.asdict(event)
    assert decoded == event
    sid = event.stream_id
    assert key == (sid.encode() if sid is not None else None)


@settings(max_examples=60, deadline=None, database=None)
@given(events())
def test_property_structured_round_trip(event: Event) -> None:
    key, value, headers = encode_structured(event)
    assert decode(key, value, headers) == event


HEADER_NAMES = st.sampled_from(
    [
        "content-type",
        "Content-Type",
        "ce_id",
        "CE_ID",
        "ce_source",
        "ce_type",
        "ce_specversion",
        "ce_subject",
        "ce_streamid",
        "ce_streamversion",
        "ce_datacontenttype",
        "traceparent",
    ]
) | st.text(max_size=12)
HEADER_VALUES = (
    st.none()
    | st.binary(max_size=24)
    | st.text(alphabet=st.characters(codec="ascii"), max_size=12).map(str.encode)
    | st.sampled_from(
        [
            b"1.0",
            b"1",
            b"0",
            b"application/json",
            b"application/cloudevents+json",
            b"application/cloudevents+json; charset=utf-8",
            b"application/cloudevents-batch+json",
            b"application/cloudevents",
        ]
    )
)
VALUES = (
    st.none()
    | st.binary(max_size=64)
    | JSON.map(orjson.dumps)
    | st.dictionaries(
        st.sampled_from(["id", "source", "type", "specversion", "data", "data_base64", "x"]),
        JSON_SCALARS | st.just("1.0") | st.lists(st.integers(-5, 5), max_size=2),
        max_size=6,
    ).map(orjson.dumps)
)


@settings(max_examples=200, deadline=None, database=None)
@given(
    key=st.none() | st.binary(max_size=16),
    value=VALUES,
    headers=st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=8),
)
def test_fuzz_decode_raises_only_decode_error(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]
) -> None:
    result: Event | DecodeError
    try:
        result = decode(key, value, headers)
    except DecodeError as exc:
        result = exc
    if isinstance(result, DecodeError):
        assert isinstance(result.reason, str)
        assert result.reason
    else:
        event = result
        assert isinstance(event, Event)
        assert event.id
        assert event.source
        assert event.type
        assert event.specversion == "1.0"


def test_missing_attribute_error_names_only_what_is_missing() -> None:
    headers = [(n, v) for n, v in REQUIRED_HEADERS if n != "ce_type"]
    with pytest.raises(DecodeError) as err:
        decode(None, None, headers)
    assert err.value.reason == "CloudEvent lacks required attribute(s): type"


def test_build_event_is_the_same_frozen_event() -> None:
    from streamapp.events import build_event

    args = (
        "i",
        "s",
        "t",
        "1.0",
        "sub",
        "2026-01-01T00:00:00Z",
        "application/json",
        None,
        {"a": 1},
        {"streamid": "x"},
    )
    built, made = build_event(*args), Event(*args)
    assert built == made
    assert dataclasses.asdict(built) == dataclasses.asdict(made)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.id = "other"  # type: ignore[misc]
    assert built.stream_id == "x"


_HEADER_NAMES = st.sampled_from(
    [
        "ce_id", "ce_source", "ce_type", "ce_specversion", "ce_subject", "ce_time",
        "ce_dataschema", "ce_datacontenttype", "ce_streamid", "ce_streamversion", "ce_x",
        "CE_ID", "Ce_Type", "ce_Source", "content-type", "Content-Type", "traceparent",
    ]
)  # fmt: skip
_HEADER_VALUES = st.sampled_from(
    [b"", b"1.0", b"0.3", b"e1", b"shop", b"order.paid", b"3", b"0", b"-1", b"x",
     b"application/json", b"application/cloudevents+json", b"text/plain", b"\xff\xfe"]
)  # fmt: skip
_VALUES = st.sampled_from(
    [None, b"", b'{"a": 1}', b"{not json", b"plain",
     b'{"specversion": "1.0", "id": "s", "source": "x", "type": "t"}']
)  # fmt: skip


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "event", call()
    except DecodeError as exc:
        return "error", exc.reason


_VALID = [("ce_id", b"e1"), ("ce_source", b"shop"), ("ce_type", b"t"), ("ce_specversion", b"1.0")]
_SOME_HEADERS = st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=10)


def _with_valid(extra: list[tuple[str, bytes]], at: int) -> list[tuple[str, bytes]]:
    """The four required attributes, valid, among ``extra`` (which may override them)."""
    return [*extra[:at], *_VALID, *extra[at:]]


@settings(max_examples=600, deadline=None)
@given(
    headers=_SOME_HEADERS | st.builds(_with_valid, _SOME_HEADERS, st.integers(0, 10)),
    value=_VALUES,
    parse_json=st.booleans(),
)
@example(  # wrong twice: a bad stream version and bad JSON (data is read later: the version)
    headers=[*_VALID, ("content-type", b"application/json"), ("ce_streamversion", b"")],
    value=b"{",
    parse_json=True,
)
def test_the_one_pass_decode_reads_every_record_as_the_attribute_by_attribute_one(
    headers: list[tuple[str, bytes]], value: bytes | None, parse_json: bool
) -> None:
    """The hot path (core attributes straight into their slots) and the general path
    (every attribute through a dict, checked by name) give the same event, or the same
    reason, for any headers: cases, duplicates, missing or bad attributes, foreign
    headers, structured values."""
    from streamapp.codecs.kafka import _decode_attributes

    fast = _outcome(lambda: decode(b"k", value, headers, parse_json=parse_json))
    general = _outcome(lambda: _decode_attributes(value, headers, parse_json))
    assert fast == general
