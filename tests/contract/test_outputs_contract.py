"""The contract of outputs, several agents per topic, and co-partitioned reads, run over
every transport (memory, Kafka, RabbitMQ, the event store alone).

- Derived events (``sinks=[...]``, the handler's ``send``) go out once per event that
  settles, and never for an event whose handler raised (rolled back with its writes).
- Agents sharing a topic each handle every event once, with their own outcome and
  policy: one agent's failure never runs the event again through the other.
- An agent reads another agent's table, co-partitioned: committed state of the
  partition with the event's number; a key of another partition fails the event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import PgUrlFactory, Services

from streamapp import App, ConfigError, Event, Park, ReadView, Redeliver, Send, Table, TableView

from .harness import AgentHarness
from .kafka_harness import KafkaHarness
from .memory_harness import MemoryHarness
from .rabbit_harness import RabbitHarness
from .store_harness import StoreHarness
from .test_agent_contract import ev, key_on, logged

Fail = Callable[[Event], Awaitable[None]]


def deriving_app(h: AgentHarness, *, fail: Fail | None = None, stateless: bool = False) -> App:
    """``deriver`` counts events per stream (unless ``stateless``) and sends one derived
    event per event, ``<id>/d``, to ``out`` (3 partitions); ``fail`` runs after both."""
    app = h.new_app()
    topic = app.topic(h.name("in"), partitions=2)
    out = app.topic(h.name("out"), partitions=3)
    counts: Table[int] = Table("counts")
    parking = h.name("in.parked")
    policy = Redeliver(pause_s=h.redeliver_pause_s, max_attempts=3, fallback=Park(parking))

    def derived(event: Event) -> Event:
        sid = event.stream_id
        assert sid is not None
        return Event.create("derived", stream_id=sid, id=f"{event.id}/d", data={"of": event.id})

    if stateless:

        @app.agent(topic, sinks=[out], on_failure=policy, name="deriver")
        async def stateless_deriver(event: Event, *, send: Send) -> None:
            h.calls[event.id] += 1
            send(out, derived(event))
            if fail is not None:
                await fail(event)

        return app

    @app.agent(topic, tables=[counts], sinks=[out], on_failure=policy, name="deriver")
    async def deriver(event: Event, counts: TableView[int], *, send: Send) -> None:
        h.calls[event.id] += 1
        sid = event.stream_id
        assert sid is not None
        counts[sid] = counts.get(sid, 0) + 1
        send(out, derived(event))
        if fail is not None:
            await fail(event)

    return app


async def derived_ids(h: AgentHarness) -> list[str]:
    """The ids of the derived events in ``out``, as a downstream consumer sees them."""
    out = []
    for record in await h.records(h.name("out")):
        event = h.parked_event(record)
        assert record.key == (event.stream_id or "").encode()  # keyed by stream id
        assert event.type == "derived"
        out.append(event.id)
    return out


class OutputsContract:
    """Subclasses provide the ``h`` fixture."""

    @pytest.fixture
    def h(self) -> AgentHarness:
        raise NotImplementedError("a transport's subclass provides the harness")

    # 1. outputs -----------------------------------------------------------------------
    async def test_each_settled_event_sends_once_a_failed_one_never(self, h: AgentHarness) -> None:
        """A flaky event (two failed attempts, then settled) sends once; a poison one
        (parked after three) never: its sends are rolled back with its table writes."""

        async def fail(event: Event) -> None:
            if event.type == "poison" or (event.type == "flaky" and h.calls[event.id] <= 2):
                raise RuntimeError(f"{event.type} {event.id}")

        await h.start(deriving_app(h, fail=fail))
        a, b = key_on(0, 2), key_on(1, 2)
        sent = [
            ev(a, "a1"),
            ev(a, "a-flaky", type="flaky"),
            ev(a, "a2"),
            ev(b, "b-poison", type="poison"),
            ev(b, "b1"),
            *[ev(f"other{i}", f"other{i}") for i in range(10)],
        ]
        for event in sent:
            await h.send(event)
        assert await h.settle()
        assert await h.unsettled() == 0
        expected = [f"{e.id}/d" for e in sent if e.type != "poison"]
        got = await derived_ids(h)
        assert sorted(got) == sorted(expected)  # each once, none for the poison
        assert h.calls["a-flaky"] == 3
        assert h.calls["b-poison"] == 3
        assert await h.table("counts", a) == 3
        assert await h.table("counts", b) == 1  # the poison's write rolled back too
        parked = await h.parked(h.name("in.parked"))
        assert [h.parked_event(r).id for r in parked] == ["b-poison"]

    async def test_an_agent_without_tables_sends_each_derived_event_once(
        self, h: AgentHarness
    ) -> None:
        await h.start(deriving_app(h, stateless=True))
        sent = [ev(f"s{i % 7}", f"e{i}") for i in range(40)]
        for event in sent:
            await h.send(event)
        assert await h.settle()
        assert await h.unsettled() == 0
        assert sorted(await derived_ids(h)) == sorted(f"{e.id}/d" for e in sent)

    # 2. several agents on one topic ----------------------------------------------------
    async def test_two_agents_on_one_topic_each_apply_every_event_once(
        self, h: AgentHarness
    ) -> None:
        """``first`` parks a poison event (for itself only: ``second`` applies it);
        ``second`` fails a flaky event twice under Redeliver: the partition waits for it,
        ``first`` does not handle it again. Each table holds every event it settled, once,
        in order."""
        app = h.new_app()
        topic = app.topic(h.name("in"), partitions=2)
        one: Table[dict[str, Any]] = Table("one")
        two: Table[dict[str, Any]] = Table("two")
        parking = h.name("in.parked")

        def log(view: TableView[dict[str, Any]], event: Event) -> None:
            sid = event.stream_id
            assert sid is not None
            row = view.get(sid, {"n": 0, "seen": []})
            view[sid] = {"n": row["n"] + 1, "seen": [*row["seen"], event.id]}

        @app.agent(topic, tables=[one], on_failure=Park(parking), name="first")
        async def first(event: Event, view: TableView[dict[str, Any]]) -> None:
            h.calls[f"first:{event.id}"] += 1
            log(view, event)
            if event.type == "poison":
                raise ValueError("poison for first")

        @app.agent(topic, tables=[two], on_failure=Redeliver(pause_s=h.redeliver_pause_s))
        async def second(event: Event, view: TableView[dict[str, Any]]) -> None:
            h.calls[f"second:{event.id}"] += 1
            log(view, event)
            if event.id == "flaky" and h.calls["second:flaky"] <= 2:
                raise ConnectionError("transient for second")

        await h.start(app)
        a, b = key_on(0, 2), key_on(1, 2)
        names_a = ["a1", "poison", "a2", "flaky", "a3"]
        for name in names_a:
            await h.send(ev(a, name, type="poison" if name == "poison" else "add"))
        names_b = [f"b{i}" for i in range(8)]
        for name in names_b:
            await h.send(ev(b, name))
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("one", a) == logged("a1", "a2", "flaky", "a3")
        assert await h.table("two", a) == logged(*names_a)
        assert await h.table("one", b) == await h.table("two", b) == logged(*names_b)
        assert h.calls["second:flaky"] == 3
        assert h.calls["first:flaky"] == 1  # not run again through first
        assert h.calls["first:poison"] == h.calls["second:poison"] == 1
        others = [n for n in [*names_a, *names_b] if n != "flaky"]
        assert all(h.calls[f"first:{n}"] == h.calls[f"second:{n}"] == 1 for n in others)
        parked = await h.parked(parking)
        assert [h.parked_event(r).id for r in parked] == ["poison"]
        assert parked[0].headers["streamapp-agent"] == b"first"
        assert parked[0].reason == "ValueError: poison for first"

    # 3. co-partitioned reads ------------------------------------------------------------
    async def test_an_agent_reads_a_co_partitioned_table_of_another(self, h: AgentHarness) -> None:
        """``reader`` (topic ``looks``) reads ``totals`` of ``writer`` (topic ``in``), both
        2 partitions: it sees the committed totals of its event's stream; a read of a key
        of another partition fails its event (parked, with why)."""
        app = h.new_app()
        adds = app.topic(h.name("in"), partitions=2)
        looks = app.topic(h.name("looks"), partitions=2)
        totals: Table[int] = Table("totals")
        seen: Table[dict[str, Any]] = Table("seen")
        parking = h.name("looks.parked")

        @app.agent(adds, tables=[totals], filter=lambda e: e.type == "add", name="writer")
        async def writer(event: Event, totals: TableView[int]) -> None:
            sid = event.stream_id
            assert sid is not None
            totals[sid] = totals.get(sid, 0) + int(event.data["n"])

        @app.agent(
            looks,
            tables=[seen],
            reads=[totals],
            filter=lambda e: e.type in ("look", "peek"),
            on_failure=Park(parking),
            name="reader",
        )
        async def reader(event: Event, seen: TableView[Any], totals: ReadView[int]) -> None:
            sid = event.stream_id
            assert sid is not None
            key = event.data["other"] if event.type == "peek" else sid
            seen[sid] = {"total": totals.get(key), "known": key in totals}

        await h.start(app)
        a, b = key_on(0, 2), key_on(1, 2)
        for i, key in enumerate([a, b, a, a, b]):
            add = Event.create("add", stream_id=key, data={"n": i + 1}, id=f"add{i}")
            await h.send(add, topic=h.name("in"))
        assert await h.settle()
        for key in (a, b, "nobody"):
            await h.send(Event.create("look", stream_id=key, id=f"look-{key}"), topic=looks.name)
        peek = Event.create("peek", stream_id=a, data={"other": b}, id="peek")
        await h.send(peek, topic=looks.name)
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("seen", a) == {"total": 1 + 3 + 4, "known": True}
        assert await h.table("seen", b) == {"total": 2 + 5, "known": True}
        assert await h.table("seen", "nobody") == {"total": None, "known": False}
        (parked,) = await h.parked(parking)
        assert h.parked_event(parked).id == "peek"
        assert f"key {b!r} belongs to partition 1" in parked.reason


class TestMemory(OutputsContract):
    @pytest.fixture
    async def h(self) -> AsyncIterator[AgentHarness]:
        harness = MemoryHarness()
        try:
            yield harness
        finally:
            await harness.stop()


@pytest.mark.integration
class TestKafka(OutputsContract):
    @pytest.fixture
    async def h(self, kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = KafkaHarness(kafka_bootstrap, tmp_path / "data")
        try:
            yield harness
        finally:
            await harness.stop()


@pytest.mark.integration
class TestRabbitMQ(OutputsContract):
    @pytest.fixture
    async def h(self, services: Services, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = RabbitHarness(services.amqp, tmp_path)
        try:
            yield harness
        finally:
            await harness.stop()


class TestEventStore(OutputsContract):
    """The store alone has no broker: an agent that sends is refused at start, naming
    it; the rest of the contract holds."""

    @pytest.fixture
    async def h(self, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = StoreHarness(f"sqlite:///{tmp_path}/events.db", tmp_path / "data")
        try:
            yield harness
        finally:
            await harness.stop()

    async def test_each_settled_event_sends_once_a_failed_one_never(self, h: AgentHarness) -> None:
        with pytest.raises(ConfigError, match=r"agent 'deriver' sends .* no broker"):
            await h.start(deriving_app(h))

    async def test_an_agent_without_tables_sends_each_derived_event_once(
        self, h: AgentHarness
    ) -> None:
        with pytest.raises(ConfigError, match=r"agent 'deriver' sends .* no broker"):
            await h.start(deriving_app(h, stateless=True))


@pytest.mark.integration
class TestEventStorePostgres(TestEventStore):
    @pytest.fixture
    async def h(self, pg_url_factory: PgUrlFactory, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        async with pg_url_factory() as url:
            harness = StoreHarness(url, tmp_path / "data")
            try:
                yield harness
            finally:
                await harness.stop()
