"""Typed events (:mod:`streamapp.agents.typed`): lazy decoding into models, upcaster chains,
unknown types, pydantic models, typed sends, and what mypy strict sees in a handler."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pydantic
import pytest

from streamapp import App, Event, EventTypes, Outcome, Park, Send, Table, TableView
from streamapp.agents.typed import schema_version
from streamapp.errors import ConfigError, DataError
from streamapp.testing import MemoryBroker
from tests.support.waits import run_watched

ROOT = Path(__file__).resolve().parents[2]


class Paid(msgspec.Struct):
    amount: int


class Shipped(msgspec.Struct):
    carrier: str


def _event(type: str, data: Any, *, schema: str | None = None, n: int = 1) -> Event:
    event = Event.create(type, stream_id="o1", data=data, version=n, id=f"e{n}")
    return dataclasses.replace(event, dataschema=schema) if schema else event


def test_data_is_decoded_when_first_read_and_only_once() -> None:
    calls: list[Any] = []

    class Counted(msgspec.Struct):
        amount: int

        def __post_init__(self) -> None:
            calls.append(self)

    types = EventTypes({"order.paid": Counted})
    typed = types.view(_event("order.paid", {"amount": 3}))
    assert isinstance(typed, Event)
    assert calls == []  # nothing decoded yet
    assert typed.data.amount == 3
    assert typed.data is typed.data
    assert len(calls) == 1


def test_data_that_does_not_fit_raises_data_error_naming_type_model_and_field() -> None:
    typed = EventTypes({"order.paid": Paid}).view(_event("order.paid", {"amount": "ten"}))
    assert isinstance(typed, Event)
    with pytest.raises(DataError) as raised:
        _ = typed.data
    for part in ("event e1", "'order.paid'", "Paid", "Expected `int`, got `str`", "$.amount"):
        assert part in raised.value.reason


def test_json_bytes_decode_straight_into_the_model() -> None:
    raw = _event("order.paid", None)
    raw = dataclasses.replace(raw, data=b'{"amount": 5}', datacontenttype="application/json")
    typed = EventTypes({"order.paid": Paid}).view(raw)
    assert isinstance(typed, Event)
    assert typed.data == Paid(5)


def test_unknown_types_pass_as_dicts_or_are_rejected() -> None:
    event = _event("order.refunded", {"x": 1})
    assert EventTypes({"order.paid": Paid}).view(event) is event
    rejected = EventTypes({"order.paid": Paid}, unknown="reject").view(event)
    assert isinstance(rejected, DataError)
    assert "'order.refunded', which has no model" in rejected.reason
    assert "order.paid" in rejected.reason


class PlacedV3(msgspec.Struct):
    customer: str
    lines: list[dict[str, int]]


def _chain() -> EventTypes:
    types = EventTypes({"order.placed": PlacedV3})

    @types.upcaster("order.placed", 1)
    def one(data: dict[str, Any]) -> dict[str, Any]:
        return {"customer": data["name"], "skus": data["skus"]}

    @types.upcaster("order.placed", 2)
    def two(data: dict[str, Any]) -> dict[str, Any]:
        return {"customer": data["customer"], "lines": [{s: 1} for s in data["skus"]]}

    return types


@pytest.mark.parametrize(
    ("data", "schema"),
    [
        ({"name": "ann", "skus": ["a"]}, None),  # written before any version existed
        ({"name": "ann", "skus": ["a"]}, "urn:orders:placed:1"),
        ({"customer": "ann", "skus": ["a"]}, "order.placed/v2"),
        ({"customer": "ann", "lines": [{"a": 1}]}, "order.placed/v3"),
    ],
)
def test_a_chain_upcasts_every_old_version_to_the_current_one(
    data: dict[str, Any], schema: str | None
) -> None:
    typed = _chain().view(_event("order.placed", data, schema=schema))
    assert isinstance(typed, Event)
    assert typed.data == PlacedV3("ann", [{"a": 1}])


def test_a_newer_schema_than_the_code_knows_is_not_deliverable() -> None:
    typed = _chain().view(_event("order.placed", {}, schema="order.placed/v4"))
    assert isinstance(typed, Event)
    with pytest.raises(DataError, match="schema version 4, newer than this code reads"):
        _ = typed.data


def test_schema_versions_are_read_from_dataschema() -> None:
    assert schema_version(_event("t", {}, schema="https://x/order.placed/v12")) == 12
    assert schema_version(_event("t", {}, schema="urn:orders:placed:3")) == 3
    assert schema_version(_event("t", {})) is None


def test_registration_refuses_what_cannot_work() -> None:
    with pytest.raises(ConfigError, match=r"neither a msgspec\.Struct nor a pydantic model"):
        EventTypes({"order.paid": dict})
    with pytest.raises(ConfigError, match="registered for types"):
        EventTypes({"a": Paid, "b": Paid})
    types = EventTypes({"order.paid": Paid})
    with pytest.raises(ConfigError, match="has no model here"):
        types.upcaster("order.placed", 1)
    types.upcaster("order.paid", 2)(lambda d: d)
    with pytest.raises(ConfigError, match=r"no upcaster from version\(s\) \[1\]"):
        types.check()
    app = App("t")
    with pytest.raises(ConfigError, match=r"agent 'h': events=: 'order\.paid': no upcaster"):
        app.agent(app.topic("in"), events=types, name="h")(_noop)


async def _noop(event: Event) -> None: ...


class PaidModel(pydantic.BaseModel):
    amount: int


async def test_pydantic_models_decode_and_their_errors_are_parked() -> None:
    app = App("t")
    totals: Table[int] = Table("totals")

    @app.agent(
        app.topic("in", partitions=1),
        tables=[totals],
        events={"order.paid": PaidModel},
        on_failure=Park("parked"),
    )
    async def total(event: Event[PaidModel], view: TableView[int]) -> None:
        view["all"] = view.get("all", 0) + event.data.amount

    broker = MemoryBroker(app)
    broker.send("in", _event("order.paid", {"amount": 4}, n=1))
    broker.send("in", _event("order.paid", {"amount": "x"}, n=2))
    counts = await broker.process()
    assert broker.table("totals")["all"] == 4
    assert counts[Outcome.NOT_DELIVERABLE] == 1
    (parked,) = broker.records("parked")
    reason = dict(parked.headers)["streamapp-park-reason"].decode()
    assert "PaidModel" in reason
    assert "amount" in reason


async def test_a_handler_that_never_reads_the_data_is_not_failed_by_it() -> None:
    app = App("t")
    seen: Table[int] = Table("seen")

    @app.agent(app.topic("in", partitions=1), tables=[seen], events={"order.paid": Paid})
    async def count(event: Event[Paid], view: TableView[int]) -> None:
        view["n"] = view.get("n", 0) + 1

    broker = MemoryBroker(app)
    broker.send("in", _event("order.paid", {"amount": "not an int"}))
    assert (await broker.process())[Outcome.DELIVERED] == 1
    assert broker.table("seen")["n"] == 1


async def test_a_registered_model_is_sent_as_its_types_event() -> None:
    app = App("t")
    out = app.topic("out", partitions=1)
    types = EventTypes({"order.paid": Paid, "order.shipped": Shipped})
    types.upcaster("order.shipped", 1)(lambda d: d)

    @app.agent(app.topic("in", partitions=1), sinks=[out], events=types)
    async def ship(event: Event[Paid | Shipped], *, send: Send) -> None:
        send(out, Shipped("dhl"), stream_id="o1", id=f"{event.id}/shipped")

    broker = MemoryBroker(app)
    broker.send("in", _event("order.paid", {"amount": 1}))
    await broker.process()
    (record,) = broker.records("out")
    headers = dict(record.headers)
    assert headers["ce_type"] == b"order.shipped"
    assert headers["ce_id"] == b"e1/shipped"
    assert headers["ce_dataschema"] == b"order.shipped/v2"  # the model reads version 2
    assert orjson.loads(record.value or b"") == {"carrier": "dhl"}
    assert record.key == b"o1"


async def test_a_model_sent_without_a_stream_id_or_unregistered_fails_the_event() -> None:
    app = App("t")
    out = app.topic("out", partitions=1)

    @app.agent(app.topic("in", partitions=1), sinks=[out], events={"order.paid": Paid})
    async def ship(event: Event[Paid], *, send: Send) -> None:
        send(out, Shipped("dhl") if event.id == "e1" else Paid(1))

    broker = MemoryBroker(app, max_attempts=1)
    broker.send("in", _event("order.paid", {"amount": 1}))
    with pytest.raises(Exception, match="needs stream_id=") as raised:
        await broker.process()
    assert "Shipped" in str(raised.value)


async def test_a_topic_read_only_by_typed_agents_decodes_json_data_once_from_bytes() -> None:
    """Every agent of the topic is typed: the codec leaves the data as its bytes and the
    model reads them (no dict between); an unknown type still gets a dict, and one whose
    data is not JSON is parked, not failed."""
    app = App("t")
    seen: list[Any] = []
    src = app.topic("in", partitions=1)

    @app.agent(src, events={"order.paid": Paid}, on_failure=Park("parked"))
    async def typed(event: Event[Paid]) -> None:
        seen.append(event.data)

    broker = MemoryBroker(app)
    factory = broker._factory  # what the tasks of this broker are built from
    assert factory.decode_for(src, [typed]) is factory.decode_bytes
    broker.send("in", _event("order.paid", {"amount": 2}, n=1))
    broker.send("in", _event("order.refunded", {"x": 1}, n=2))
    broker.send_raw(
        "in",
        b"{not json",
        key=b"o1",
        headers=[("ce_id", b"e3"), ("ce_source", b"s"), ("ce_type", b"order.void"),
                 ("ce_specversion", b"1.0"), ("ce_streamid", b"o1"),
                 ("content-type", b"application/json")],
    )  # fmt: skip
    counts = await broker.process()
    assert seen == [Paid(2), {"x": 1}]
    assert counts[Outcome.NOT_DELIVERABLE] == 1
    (parked,) = broker.records("parked")
    assert "not valid JSON" in dict(parked.headers)["streamapp-park-reason"].decode()


def test_data_reads_the_same_from_bytes_and_from_decoded_json() -> None:
    """Live (bytes) and replayed (a dict from the store) data decode alike."""

    class Tally(msgspec.Struct):
        counts: dict[int, str]

    types = EventTypes({"t": Tally})
    raw = dataclasses.replace(
        _event("t", None), data=b'{"counts": {"1": "x"}}', datacontenttype="application/json"
    )
    from_bytes, from_dict = types.view(raw), types.view(_event("t", {"counts": {"1": "x"}}))
    assert isinstance(from_bytes, Event)
    assert isinstance(from_dict, Event)
    assert from_bytes.data == from_dict.data == Tally({1: "x"})


async def test_a_topic_with_an_untyped_agent_keeps_parsing_json_for_it() -> None:
    app = App("t")
    src = app.topic("in", partitions=1)
    got: dict[str, Any] = {}

    @app.agent(src, events={"order.paid": Paid})
    async def typed(event: Event[Paid]) -> None:
        got["typed"] = event.data

    @app.agent(src)
    async def plain(event: Event) -> None:
        got["plain"] = event.data

    broker = MemoryBroker(app)
    factory = broker._factory
    assert factory.decode_for(src, [typed, plain]) is factory.decode
    broker.send("in", _event("order.paid", {"amount": 7}))
    await broker.process()
    assert got == {"typed": Paid(7), "plain": {"amount": 7}}


def test_mypy_strict_sees_the_models_in_a_handler(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text(
        "from streamapp import Event\n"
        "from tests.apps.typed_orders import OrderPaid, OrderEvent\n"
        "def f(event: Event[OrderEvent]) -> int:\n"
        "    data = event.data\n"
        "    return data.amount if isinstance(data, OrderPaid) else 0\n"
    )
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from streamapp import Event\n"
        "from tests.apps.typed_orders import OrderPaid, OrderEvent\n"
        "def f(event: Event[OrderEvent]) -> int:\n"
        "    data = event.data\n"
        "    if isinstance(data, OrderPaid):\n"
        "        return data.amout\n"  # a typo: no such field
        "    return data.amount\n"  # not narrowed: not every model has it
    )
    run = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(good), str(bad)]
    out = run_watched(run, cwd=ROOT)
    lines = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert all(line.startswith(str(bad)) for line in lines), out.stdout
    assert any('"OrderPaid" has no attribute "amout"' in line for line in lines), out.stdout
    assert any('has no attribute "amount"' in line for line in lines), out.stdout
