"""Plain topics (``format="json"`` / ``"raw"``): records that are not CloudEvents become
events by the topic's rules, and a record that breaks them is NOT_DELIVERABLE with its
reason, under the agent's policy (:mod:`streamapp.codecs.plain`)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamapp import App, Event, FromEventStore, Outcome, Park, Table, TableView
from streamapp.codecs import plain
from streamapp.errors import ConfigError, DecodeError
from streamapp.records import DeliveryRecord
from streamapp.testing import MemoryBroker
from streamapp.topics import TopicFormat, TopicSpec


def _record(
    value: bytes | None, key: bytes | None = b"acct-1", position: int = 7
) -> DeliveryRecord:
    return DeliveryRecord("payments", 2, position, key, value, ())


def test_a_json_record_becomes_an_event_keyed_by_the_record_key() -> None:
    spec = TopicSpec("payments", 4, TopicFormat.JSON)
    event = plain.decoder(spec)(_record(b'{"amount": 5}'))
    assert (event.id, event.source, event.type) == ("payments/2/7", "payments", "payments")
    assert event.stream_id == "acct-1"
    assert event.stream_version is None
    assert event.data == {"amount": 5}
    assert event.datacontenttype == "application/json"


def test_named_fields_give_the_type_and_the_stream_id() -> None:
    spec = TopicSpec("payments", 4, TopicFormat.JSON, type_field="kind", stream_id_field="acct")
    event = plain.decoder(spec)(_record(b'{"kind": "paid", "acct": 42}', key=None))
    assert (event.type, event.stream_id) == ("paid", "42")


def test_a_raw_record_keeps_its_bytes() -> None:
    event = plain.decoder(TopicSpec("payments", 4, TopicFormat.RAW))(_record(b"\x00\xff"))
    assert (event.data, event.stream_id) == (b"\x00\xff", "acct-1")
    assert event.datacontenttype == "application/octet-stream"


@pytest.mark.parametrize(
    ("spec", "record", "reason"),
    [
        (TopicSpec("payments", 4, TopicFormat.JSON), _record(b"{nope"), "is not JSON"),
        (TopicSpec("payments", 4, TopicFormat.JSON), _record(None), "has no value"),
        (TopicSpec("payments", 4, TopicFormat.JSON), _record(b"{}", key=None), "has no key"),
        (TopicSpec("payments", 4, TopicFormat.RAW), _record(b"x", key=None), "has no key"),
        (
            TopicSpec("payments", 4, TopicFormat.JSON),
            _record(b"{}", key=b"\xff"),
            "not valid UTF-8",
        ),
        (
            TopicSpec("payments", 4, TopicFormat.JSON, stream_id_field="acct"),
            _record(b'{"other": 1}'),
            "has no field 'acct' (stream_id_field)",
        ),
        (
            TopicSpec("payments", 4, TopicFormat.JSON, stream_id_field="acct"),
            _record(b"[1, 2]"),
            "is a JSON list, not an object",
        ),
        (
            TopicSpec("payments", 4, TopicFormat.JSON, type_field="kind"),
            _record(b'{"kind": 3}'),
            "field 'kind' (type_field) is 3, not a string",
        ),
        (
            TopicSpec("payments", 4, TopicFormat.JSON, stream_id_field="acct"),
            _record(b'{"acct": true}'),
            "is True, not a string or an integer",
        ),
    ],
)
def test_a_record_that_breaks_the_rules_says_why(
    spec: TopicSpec, record: DeliveryRecord, reason: str
) -> None:
    with pytest.raises(DecodeError, match=r"topic 'payments'|UTF-8") as raised:
        plain.decoder(spec)(record)
    assert reason in str(raised.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(data=json_values, stream_id=st.text(min_size=1))
def test_what_a_plain_send_writes_reads_back_as_the_same_data_and_stream(
    data: object, stream_id: str
) -> None:
    spec = TopicSpec("payments", 4, TopicFormat.JSON)
    key, value, headers = plain.encode(spec, Event.create("t", stream_id=stream_id, data=data))
    assert headers == []
    event = plain.decoder(spec)(DeliveryRecord("payments", 0, 0, key, value, ()))
    assert (event.data, event.stream_id) == (data, stream_id)


def test_the_topic_declaration_refuses_bad_formats_and_fields() -> None:
    app = App("t")
    with pytest.raises(ValueError, match="format='xml' is not one of 'cloudevents', 'json', 'raw'"):
        app.topic("a", format="xml")
    with pytest.raises(ValueError, match="they need format='json'"):
        app.topic("b", format="raw", stream_id_field="id")
    with pytest.raises(ValueError, match="they need format='json'"):
        app.topic("c", type_field="kind")
    app.topic("d", format="json")
    with pytest.raises(ConfigError, match="declared twice with different formats"):
        app.topic("d", format="raw")
    assert app.topic("d", format="json").format is TopicFormat.JSON


def test_an_agent_with_history_on_a_plain_topic_is_refused() -> None:
    app = App("t")
    topic = app.topic("payments", format="json")
    with pytest.raises(ConfigError, match=r"plain topic 'payments'.*no stream versions"):

        @app.agent(topic, history=FromEventStore())
        async def project(event: Event) -> None: ...


async def test_a_memory_broker_projects_a_plain_topic_and_parks_what_is_not_json() -> None:
    app = App("t")
    topic = app.topic("payments", partitions=2, format="json", stream_id_field="acct")
    balances: Table[int] = Table("balances")
    out = app.topic("receipts", partitions=2, format="json")

    @app.agent(topic, tables=[balances], sinks=[out], on_failure=Park("payments-parked"))
    async def project(event: Event, view: TableView[int], *, send: object) -> None:
        acct = event.stream_id
        assert acct is not None
        view[acct] = view.get(acct, 0) + event.data["amount"]
        send(out, Event.create("receipt", stream_id=acct, data={"total": view[acct]}))  # type: ignore[operator]

    broker = MemoryBroker(app)
    broker.send_raw("payments", b'{"acct": "a", "amount": 3}', key=b"a")
    broker.send_raw("payments", b"not json", key=b"a")
    broker.send_raw("payments", b'{"acct": "a", "amount": 4}', key=b"a")
    broker.send_raw("payments", b'{"amount": 1}', key=b"b")
    counts = await broker.process()
    assert counts[Outcome.DELIVERED] == 2
    assert counts[Outcome.NOT_DELIVERABLE] == 2
    assert broker.table("balances")["a"] == 7
    reasons = sorted(
        dict(r.headers)["streamapp-park-reason"] for r in broker.records("payments-parked")
    )
    assert [b"is not JSON" in r or b"no field 'acct'" in r for r in reasons] == [True, True]
    receipts = [orjson.loads(r.value or b"") for r in broker.records("receipts")]
    assert receipts == [{"total": 3}, {"total": 7}]
    assert all(r.headers == () and r.key == b"a" for r in broker.records("receipts"))
