"""Agents over the in-memory broker: outcomes, version guard, failure policies, app wiring."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from streamapp import App, ConfigError, Event, Outcome, Park, Redeliver, Table, TableView
from streamapp.agents.agent import handle
from streamapp.errors import DecodeError
from streamapp.tables.partition import PartitionTables, spaces_for
from streamapp.tables.store import MemoryStore
from streamapp.testing.broker import MemoryBroker, StuckRecordsError
from streamapp.topics import partition_for

PARK_REASON = "streamapp-park-reason"


def keys_on_distinct_partitions(partitions: int = 2) -> tuple[str, str]:
    """Two stream ids that land on different partitions of an N-partition topic."""
    first = "k0"
    p0 = partition_for(first.encode(), partitions)
    for i in range(1, 1000):
        other = f"k{i}"
        if partition_for(other.encode(), partitions) != p0:
            return first, other
    raise AssertionError("no two keys on distinct partitions")


def ev(stream_id: str, n: int, version: int | None = None, type: str = "add") -> Event:
    return Event.create(
        type, stream_id=stream_id, data={"n": n}, version=version, id=f"{stream_id}-{n}", time="t"
    )


def counter_app(
    *, on_failure: Any = None, filter: Any = None, fail: Any = None
) -> tuple[App, Table[Any]]:
    """An app summing ``data.n`` per stream and recording the order of events seen."""
    app = App("t")
    topic = app.topic("in", partitions=2)
    sums: Table[Any] = Table("sums")

    @app.agent(topic, tables=[sums], on_failure=on_failure, filter=filter)
    async def summer(event: Event, view: TableView[Any]) -> None:
        sid = event.stream_id
        assert sid is not None
        row = view.get(sid, {"total": 0, "seen": []})
        view[sid] = {"total": row["total"] + event.data["n"], "seen": [*row["seen"], event.id]}
        if fail is not None:
            fail(event)  # raises after the write: the write must be rolled back

    return app, sums


async def test_delivered_updates_table() -> None:
    app, _ = counter_app()
    broker = MemoryBroker(app)
    broker.send("in", ev("a", 1))
    broker.send("in", ev("a", 2))
    broker.send("in", ev("b", 5))
    counts = await broker.process()
    assert counts == Counter({Outcome.DELIVERED: 3})
    assert broker.table("sums")["a"] == {"total": 3, "seen": ["a-1", "a-2"]}
    assert broker.table("sums").get("b") == {"total": 5, "seen": ["b-5"]}
    assert broker.table("sums").get("zzz") is None
    with pytest.raises(KeyError):
        broker.table("sums")["zzz"]
    assert broker.pending("in") == 0
    assert await broker.process() == Counter()  # nothing left to do


async def test_stream_version_guard_filters_duplicates_and_older() -> None:
    app, _ = counter_app()
    broker = MemoryBroker(app)
    broker.send("in", ev("a", 1, version=1))
    broker.send("in", ev("a", 2, version=2))
    broker.send("in", ev("a", 20, version=2))  # duplicate in the same batch
    counts = await broker.process()
    assert counts == Counter({Outcome.DELIVERED: 2, Outcome.FILTERED: 1})
    broker.send("in", ev("a", 200, version=2))  # duplicate in a later batch
    broker.send("in", ev("a", 100, version=1))  # older
    broker.send("in", ev("a", 3, version=3))
    counts = await broker.process()
    assert counts == Counter({Outcome.FILTERED: 2, Outcome.DELIVERED: 1})
    assert broker.table("sums")["a"] == {"total": 6, "seen": ["a-1", "a-2", "a-3"]}
    assert broker.pending("in") == 0


async def test_stream_versions_are_per_stream() -> None:
    app, _ = counter_app()
    broker = MemoryBroker(app)
    broker.send("in", ev("a", 1, version=5))
    broker.send("in", ev("b", 2, version=1))
    assert await broker.process() == Counter({Outcome.DELIVERED: 2})
    assert broker.table("sums")["b"]["total"] == 2


async def test_events_without_streamversion_are_always_applied() -> None:
    app, _ = counter_app()
    broker = MemoryBroker(app)
    broker.send("in", ev("a", 1, version=4))
    for _ in range(3):
        broker.send("in", ev("a", 1))
    assert await broker.process() == Counter({Outcome.DELIVERED: 4})
    assert broker.table("sums")["a"]["total"] == 4


async def test_events_without_streamversion_are_counted_as_at_least_once() -> None:
    from streamapp.web.metrics import WorkerMetrics

    app, _ = counter_app()
    metrics = WorkerMetrics()
    broker = MemoryBroker(app, metrics=metrics)
    broker.send("in", ev("a", 1, version=1))
    broker.send("in", ev("a", 2))
    broker.send("in", ev("b", 3))
    assert await broker.process() == Counter({Outcome.DELIVERED: 3})
    text = metrics.render().decode()
    assert 'streamapp_unversioned_events_total{agent="summer"} 2.0' in text


async def test_filter_gives_filtered() -> None:
    app, _ = counter_app(filter=lambda e: e.type != "skip")
    broker = MemoryBroker(app)
    broker.send("in", ev("a", 1))
    broker.send("in", ev("a", 10, type="skip"))
    broker.send("in", ev("a", 2))
    counts = await broker.process()
    assert counts == Counter({Outcome.DELIVERED: 2, Outcome.FILTERED: 1})
    assert broker.table("sums")["a"]["total"] == 3
    assert broker.pending("in") == 0


async def test_missing_stream_id_is_parked_with_reason() -> None:
    app, _ = counter_app(on_failure=Park("in.parked"))
    broker = MemoryBroker(app)
    orphan = Event(id="o", source="s", type="add", datacontenttype="application/json", data={})
    broker.send("in", orphan)
    broker.send("in", ev("a", 1))
    counts = await broker.process()
    assert counts == Counter({Outcome.NOT_DELIVERABLE: 1, Outcome.DELIVERED: 1})
    parked = broker.records("in.parked")
    assert len(parked) == 1
    headers = dict(parked[0].headers)
    assert b"no stream id" in headers[PARK_REASON]
    assert headers["ce_id"] == b"o"
    assert parked[0].value == b"{}"
    assert broker.pending("in") == 0
    assert broker.table("sums")["a"]["total"] == 1


async def test_undecodable_record_is_parked_with_reason() -> None:
    app, _ = counter_app(on_failure=Park("in.parked"))
    broker = MemoryBroker(app)
    broker.send_raw("in", b"hello", key=b"a", headers=[("x", b"\xff")])
    assert await broker.process() == Counter({Outcome.NOT_DELIVERABLE: 1})
    [parked] = broker.records("in.parked")
    assert parked.key == b"a"
    assert parked.value == b"hello"
    assert parked.headers[0] == ("x", b"\xff")
    assert b"not a CloudEvent" in dict(parked.headers)[PARK_REASON]


async def test_handler_error_rolls_back_parks_and_partition_goes_on() -> None:
    def fail(event: Event) -> None:
        if event.data["n"] == 666:
            raise RuntimeError("boom")

    app, _ = counter_app(on_failure=Park("in.parked"), fail=fail)
    broker = MemoryBroker(app)
    broker.send("in", ev("a", 1))
    broker.send("in", ev("a", 666, version=None))
    broker.send("in", ev("a", 2))
    counts = await broker.process()
    assert counts == Counter({Outcome.DELIVERED: 2, Outcome.FAILED: 1})
    assert broker.table("sums")["a"] == {"total": 3, "seen": ["a-1", "a-2"]}
    [parked] = broker.records("in.parked")
    assert dict(parked.headers)[PARK_REASON] == b"RuntimeError: boom"
    assert dict(parked.headers)["ce_id"] == b"a-666"
    assert broker.pending("in") == 0


async def test_failed_versioned_event_does_not_record_its_version() -> None:
    def fail(event: Event) -> None:
        if event.data["n"] == 666:
            raise RuntimeError("boom")

    app, _ = counter_app(on_failure=Park("in.parked"), fail=fail)
    broker = MemoryBroker(app)
    broker.send("in", ev("a", 666, version=1))
    broker.send("in", ev("a", 1, version=1))  # same version, now succeeds: not a duplicate
    counts = await broker.process()
    assert counts == Counter({Outcome.FAILED: 1, Outcome.DELIVERED: 1})
    assert broker.table("sums")["a"] == {"total": 1, "seen": ["a-1"]}


async def test_redeliver_fails_twice_then_succeeds_as_if_once() -> None:
    first, other = keys_on_distinct_partitions()
    attempts: Counter[str] = Counter()

    def fail(event: Event) -> None:
        attempts[event.id] += 1
        if event.id == f"{first}-2" and attempts[event.id] <= 2:
            raise ConnectionError("flaky")

    app, _ = counter_app(fail=fail)
    assert isinstance(app.agents["summer"].on_failure, Redeliver)
    broker = MemoryBroker(app)
    broker.send("in", ev(first, 1))
    broker.send("in", ev(first, 2))
    broker.send("in", ev(first, 3))
    broker.send("in", ev(other, 7))
    counts = await broker.process()
    assert counts == Counter({Outcome.FAILED: 2, Outcome.DELIVERED: 4})
    assert attempts == Counter({f"{first}-1": 1, f"{first}-2": 3, f"{first}-3": 1, f"{other}-7": 1})
    assert broker.table("sums")[first] == {
        "total": 6,
        "seen": [f"{first}-1", f"{first}-2", f"{first}-3"],
    }
    assert broker.table("sums")[other] == {"total": 7, "seen": [f"{other}-7"]}
    assert broker.pending("in") == 0
    assert len(broker.records("in")) == 4
    assert not any(t.endswith("parked") for t in broker.topics)


async def test_redeliver_always_failing_raises_stuck_other_partition_goes_on() -> None:
    stuck, other = keys_on_distinct_partitions()

    def fail(event: Event) -> None:
        if event.id == f"{stuck}-2":
            raise ValueError("never")

    app, _ = counter_app(fail=fail)
    broker = MemoryBroker(app, max_attempts=3)
    broker.send("in", ev(stuck, 1))
    broker.send("in", ev(stuck, 2))
    broker.send("in", ev(stuck, 3))
    broker.send("in", ev(other, 5))
    broker.send("in", ev(other, 6))
    with pytest.raises(StuckRecordsError) as raised:
        await broker.process()
    assert raised.value.counts == Counter({Outcome.FAILED: 3, Outcome.DELIVERED: 3})
    (record,) = raised.value.stuck
    p = partition_for(stuck.encode(), 2)
    assert (record.agent, record.record.partition, record.record.position) == ("summer", p, 1)
    assert (record.attempts, record.error) == (3, "ValueError: never")
    message = str(raised.value)
    for part in (
        "agent 'summer'",
        f"topic 'in' partition {p} position 1",
        f"event id '{stuck}-2'",
        "failed 3 times, last error: ValueError: never",
    ):
        assert part in message
    assert broker.pending("in") == 2  # the failing record and the one behind it
    assert broker.table("sums")[stuck] == {"total": 1, "seen": [f"{stuck}-1"]}
    assert broker.table("sums")[other]["total"] == 11  # the other partition went on
    # a later round tries again, still in order, still does not settle, and says so
    with pytest.raises(StuckRecordsError) as again:
        await broker.process()
    assert again.value.counts == Counter({Outcome.FAILED: 3})
    assert broker.pending("in") == 2
    assert broker.table("sums")[stuck]["seen"] == [f"{stuck}-1"]


async def test_per_key_order_is_preserved() -> None:
    a, b = keys_on_distinct_partitions()
    failed: set[str] = set()

    def fail(event: Event) -> None:
        if event.data["n"] % 7 == 3 and event.id not in failed:
            failed.add(event.id)
            raise RuntimeError("once")

    app, _ = counter_app(fail=fail)
    broker = MemoryBroker(app)
    for n in range(30):
        broker.send("in", ev(a if n % 3 else b, n, version=None))
        broker.send("in", ev(f"c{n % 4}", n, version=n // 4 + 1))
    await broker.process()
    assert broker.pending("in") == 0
    for key in (a, b, "c0", "c1", "c2", "c3"):
        seen = broker.table("sums")[key]["seen"]
        numbers = [int(i.rsplit("-", 1)[1]) for i in seen]
        assert numbers == sorted(numbers)
        assert len(numbers) == len(set(numbers))
    assert len(broker.table("sums")[a]["seen"]) == 20
    assert len(broker.table("sums")["c1"]["seen"]) == 8


async def test_agent_without_tables() -> None:
    app = App("t")
    seen: list[str] = []

    @app.agent(app.topic("in", partitions=1))
    async def log(event: Event) -> None:
        seen.append(event.id)

    broker = MemoryBroker(app)
    broker.send("in", ev("a", 1, version=1))
    broker.send("in", ev("a", 2, version=1))  # no table: no version guard state
    assert await broker.process() == Counter({Outcome.DELIVERED: 2})
    assert seen == ["a-1", "a-2"]


async def test_handle_directly() -> None:
    app, sums = counter_app()
    agent = app.agents["summer"]
    pt = PartitionTables([sums], MemoryStore(spaces_for([sums])), 0)
    handled = await handle(agent, DecodeError("bad bytes"), pt)
    assert (handled.outcome, handled.reason) == (Outcome.NOT_DELIVERABLE, "bad bytes")
    assert (await handle(agent, ev("a", 1, version=1), pt)).outcome is Outcome.DELIVERED
    assert (await handle(agent, ev("a", 1, version=1), pt)).outcome is Outcome.FILTERED
    assert pt.applied_version("a") == 1
    assert Outcome.DELIVERED.settles
    assert Outcome.FILTERED.settles
    assert not any(o.settles for o in Outcome if o not in (Outcome.DELIVERED, Outcome.FILTERED))


async def test_agent_is_callable_directly() -> None:
    app, sums = counter_app()
    pt = PartitionTables([sums], MemoryStore(spaces_for([sums])), 0)
    await app.agents["summer"](ev("x", 4), *pt.views)
    assert pt.views[0]["x"] == {"total": 4, "seen": ["x-4"]}


# --- app registration ------------------------------------------------------------


async def noop(event: Event, *views: Any) -> None:
    return None


def test_same_agent_name_twice() -> None:
    app = App("t")
    app.agent(app.topic("a"), name="x")(noop)
    with pytest.raises(ConfigError, match="'x'"):
        app.agent(app.topic("b"), name="x")(noop)


def test_two_agents_on_one_topic() -> None:
    app = App("t")
    topic = app.topic("a")
    x = app.agent(topic, name="x")(noop)
    y = app.agent(topic, name="y")(noop)
    assert app.agents_of("a") == [x, y]  # in registration order: the order they run in
    assert list(app.sources) == ["a"]


def test_table_shared_by_two_agents() -> None:
    app = App("t")
    table: Table[Any] = Table("shared")
    app.agent(app.topic("a"), tables=[table], name="x")(noop)
    with pytest.raises(ConfigError, match="shared"):
        app.agent(app.topic("b"), tables=[Table("shared")], name="y")(noop)
    assert list(app.agents) == ["x"]


def test_topic_declared_twice() -> None:
    app = App("t")
    first = app.topic("a", partitions=4)
    assert app.topic("a", partitions=4) == first
    with pytest.raises(ConfigError, match="'a'"):
        app.topic("a", partitions=6)
    assert app.topics["a"].partitions == 4


def test_topic_spec_validation() -> None:
    app = App("t")
    with pytest.raises(ValueError, match="partition"):
        app.topic("a", partitions=0)
    with pytest.raises(ValueError, match="partition"):
        app.topic("", partitions=1)


def test_topic_plan() -> None:
    app = App("shop")
    parked_topic = app.topic("orders", partitions=6)
    plain_topic = app.topic("payments", partitions=3)
    app.agent(
        parked_topic, tables=[Table("status"), Table("totals")], on_failure=Park("orders.parked")
    )(noop)
    app.agent(plain_topic, tables=[Table("paid")], name="payer")(noop)
    plan = {p.name: p for p in app.topic_plan()}
    assert set(plan) == {
        "orders",
        "shop-noop-changelog",
        "orders.parked",
        "payments",
        "shop-payer-changelog",
        "shop-members",
    }
    members = plan["shop-members"]
    assert (members.partitions, members.compacted, members.role) == (1, True, "members")
    assert (plan["orders"].partitions, plan["orders"].compacted, plan["orders"].role) == (
        6,
        False,
        "source",
    )
    for name in ("shop-noop-changelog",):
        assert (plan[name].partitions, plan[name].compacted, plan[name].role) == (
            6,
            True,
            "changelog",
        )
    assert plan["shop-payer-changelog"].partitions == 3
    assert plan["shop-payer-changelog"].compacted
    assert plan["orders.parked"].role == "parking"
    assert not plan["orders.parked"].compacted
    assert plan["payments"].partitions == 3
    assert app.changelog_topic(app.agents["noop"]) == "shop-noop-changelog"  # one per agent
