"""The reference orders app (agents/orders.py) over the in-memory broker."""

from __future__ import annotations

from collections import Counter

from agents.orders import app, project_order_status
from streamapp import Event, Outcome, Park
from streamapp.testing.broker import MemoryBroker

PARKED = "orders.parked"
REASON = "streamapp-park-reason"


def order(type: str, order_id: str, version: int | None = None, n: int = 0) -> Event:
    return Event.create(
        f"order.{type}",
        stream_id=order_id,
        version=version,
        data={"n": n},
        id=f"{order_id}-{type}-{n}",
        source="/shop",
    )


def reasons(broker: MemoryBroker) -> list[str]:
    return [dict(r.headers)[REASON].decode() for r in broker.records(PARKED)]


def test_reference_app_wiring() -> None:
    assert project_order_status.on_failure == Park(PARKED)
    plan = {p.name: p for p in app.topic_plan()}
    assert plan["orders"].partitions == 8
    assert plan["orders-project_order_status-changelog"].compacted
    assert plan["orders-project_order_status-changelog"].partitions == 8
    assert plan[PARKED].role == "parking"


async def test_orders_statuses_and_versions() -> None:
    broker = MemoryBroker(app)
    broker.send("orders", order("placed", "o-1", 1))
    broker.send("orders", order("paid", "o-1", 2))
    broker.send("orders", order("shipped", "o-1", 3))
    broker.send("orders", order("placed", "o-2", 1))
    broker.send("orders", order("cancelled", "o-2", 2))
    broker.send("orders", order("placed", "o-3"))
    counts = await broker.process()
    assert counts == Counter({Outcome.DELIVERED: 6})
    statuses = broker.table("order_status")
    assert statuses["o-1"] == {"status": "shipped", "version": 3, "last_event_id": "o-1-shipped-0"}
    assert statuses["o-2"] == {
        "status": "cancelled",
        "version": 2,
        "last_event_id": "o-2-cancelled-0",
    }
    assert statuses["o-3"] == {"status": "placed", "version": 1, "last_event_id": "o-3-placed-0"}
    assert statuses.get("o-4") is None
    assert broker.records(PARKED) == []


async def test_orders_redelivered_events_apply_once() -> None:
    broker = MemoryBroker(app)
    broker.send("orders", order("placed", "o-1", 1))
    broker.send("orders", order("paid", "o-1", 2))
    await broker.process()
    broker.send("orders", order("paid", "o-1", 2, n=1))  # redelivery of version 2
    broker.send("orders", order("placed", "o-1", 1, n=1))  # replay of version 1
    broker.send("orders", order("shipped", "o-1", 3))
    counts = await broker.process()
    assert counts == Counter({Outcome.FILTERED: 2, Outcome.DELIVERED: 1})
    assert broker.table("order_status")["o-1"] == {
        "status": "shipped",
        "version": 3,
        "last_event_id": "o-1-shipped-0",
    }


async def test_orders_bad_records_are_parked_and_others_go_on() -> None:
    """The orders handler never reads ``data``: a record whose JSON data is bad is applied
    (its data never decoded; an agent that reads it parks it: the contract suite)."""
    broker = MemoryBroker(app)
    broker.send("orders", order("placed", "o-1", 1))
    not_json = [
        ("ce_id", b"bad-json"),
        ("ce_source", b"/shop"),
        ("ce_type", b"order.paid"),
        ("ce_specversion", b"1.0"),
        ("ce_streamid", b"o-1"),
        ("content-type", b"application/json"),
    ]
    broker.send_raw("orders", b"{not json", key=b"o-1", headers=not_json)
    broker.send("orders", order("refunded", "o-1", 2))
    broker.send(
        "orders",
        Event(id="anon", source="/shop", type="order.placed", datacontenttype="application/json"),
    )
    broker.send("orders", order("paid", "o-1", 2))
    counts = await broker.process()
    assert counts == Counter({Outcome.DELIVERED: 3, Outcome.NOT_DELIVERABLE: 1, Outcome.FAILED: 1})
    assert broker.pending("orders") == 0
    assert broker.table("order_status")["o-1"] == {
        "status": "paid",
        "version": 3,  # placed, the bad-json paid (no streamversion: applied), paid
        "last_event_id": "o-1-paid-0",
    }
    parked = broker.records(PARKED)
    assert len(parked) == 2
    by_id = {dict(r.headers)["ce_id"]: dict(r.headers)[REASON].decode() for r in parked}
    assert by_id[b"o-1-refunded-0"] == "ValueError: unknown order event type 'order.refunded'"
    assert "no stream id" in by_id[b"anon"]
    assert len(reasons(broker)) == 2
