"""The agent contract: one suite of agent semantics, run over every transport.

:class:`AgentContract` holds the tests; each transport subclasses it with a ``h`` fixture
giving its :class:`~tests.contract.harness.AgentHarness` (RabbitMQ and the event store
join the same way). Outcomes and settling follow DESIGN.md, "Outcomes and settling".
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import PgUrlFactory, Services

from streamapp import App, Event, Park, Redeliver, Table, TableView
from streamapp.codecs import kafka as codec
from streamapp.errors import ConcurrencyError, DecodeError, InvalidEventError
from streamapp.topics import partition_for

from .harness import AgentHarness
from .kafka_harness import KafkaHarness
from .memory_harness import MemoryHarness
from .rabbit_harness import RabbitHarness
from .store_harness import StoreHarness

Fail = Callable[[Event, TableView[Any]], Awaitable[None]]
AGENT = "logger"


def key_on(partition: int, partitions: int, prefix: str = "k", skip: int = 0) -> str:
    """The ``skip``-th key ``prefix<i>`` that belongs to ``partition``."""
    found = [
        f"{prefix}{i}"
        for i in range(10_000)
        if partition_for(f"{prefix}{i}".encode(), partitions) == partition
    ]
    return found[skip]


def ev(sid: str, name: str, *, version: int | None = None, type: str = "add") -> Event:
    return Event.create(type, stream_id=sid, data={"name": name}, version=version, id=name)


def log_app(
    h: AgentHarness,
    *,
    partitions: int = 2,
    filter: Callable[[Event], bool] | None = None,
    on_failure: Park | Redeliver | None = None,
    fail: Fail | None = None,
    **settings: Any,
) -> App:
    """One agent that logs, per stream, how many events it applied and their ids in
    order; ``fail`` runs after that write (so a failure must roll it back). It reads each
    event's data first (data that is not JSON is NOT_DELIVERABLE there). ``settings``
    go to the app."""
    app = h.new_app(**settings)
    topic = app.topic(h.name("in"), partitions=partitions)
    log: Table[dict[str, Any]] = Table("log")

    @app.agent(topic, tables=[log], filter=filter, on_failure=on_failure, name=AGENT)
    async def logger(event: Event, view: TableView[dict[str, Any]]) -> None:
        _ = event.data  # decoded when first read: bad JSON raises DataError here
        h.calls[event.id] += 1
        sid = event.stream_id
        assert sid is not None
        row = view.get(sid, {"n": 0, "seen": []})
        view[sid] = {"n": row["n"] + 1, "seen": [*row["seen"], event.id]}
        if fail is not None:
            await fail(event, view)

    return app


def logged(*ids: str) -> dict[str, Any]:
    return {"n": len(ids), "seen": list(ids)}


def data_app(h: AgentHarness, *, on_failure: Park | Redeliver | None = None) -> App:
    """One agent that logs ``id:name`` per stream, writing first: events of type
    ``reads`` read their data after the write (its ``name``), ``skips`` never read it."""
    app = h.new_app()
    topic = app.topic(h.name("in"), partitions=2)
    log: Table[dict[str, Any]] = Table("log")

    @app.agent(topic, tables=[log], on_failure=on_failure, name=AGENT)
    async def logger(event: Event, view: TableView[dict[str, Any]]) -> None:
        sid = event.stream_id
        assert sid is not None
        row = view.get(sid, {"n": 0, "seen": []})
        view[sid] = {"n": row["n"] + 1, "seen": [*row["seen"], f"{event.id}:-"]}
        if event.type == "reads":
            name = event.data["name"]  # after the write: a DataError rolls it back
            view[sid] = {"n": row["n"] + 1, "seen": [*row["seen"], f"{event.id}:{name}"]}

    return app


class AgentContract:
    """Agent semantics every transport must give. Subclasses provide the ``h`` fixture."""

    @pytest.fixture
    def h(self) -> AgentHarness:
        raise NotImplementedError("a transport's subclass provides the harness")

    # 1. DELIVERED ---------------------------------------------------------------------
    async def test_delivered_applies_in_order_per_key_across_partitions(
        self, h: AgentHarness
    ) -> None:
        await h.start(log_app(h, partitions=3))
        keys = [f"order-{i}" for i in range(9)]
        assert {partition_for(k.encode(), 3) for k in keys} == {0, 1, 2}
        expected: dict[str, list[str]] = {k: [] for k in keys}
        for i in range(180):
            key = keys[(i * 4 + i // 9) % 9]  # interleaved: every batch mixes keys
            version = len(expected[key]) + 1
            name = f"{key}#{version}"
            expected[key].append(name)
            await h.send(ev(key, name, version=version if i % 5 else None))
        assert await h.settle()
        assert await h.unsettled() == 0
        for key in keys:
            assert await h.table("log", key) == logged(*expected[key])
        assert sorted(h.calls) == sorted(n for names in expected.values() for n in names)
        assert set(h.calls.values()) == {1}
        assert await h.table("log", "order-never-sent") is None

    # 2. FILTERED ------------------------------------------------------------------------
    async def test_filtered_is_not_applied_but_settled(self, h: AgentHarness) -> None:
        a, b = key_on(0, 2), key_on(1, 2)
        await h.start(log_app(h, filter=lambda e: e.type != "skip"))
        for event in (
            ev(a, "a1"),
            ev(a, "a2", type="skip"),
            ev(a, "a3"),
            ev(b, "b1", type="skip"),
            ev(b, "b2"),
            ev("only-skipped", "c1", type="skip"),
        ):
            await h.send(event)
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("log", a) == logged("a1", "a3")
        assert await h.table("log", b) == logged("b2")
        assert await h.table("log", "only-skipped") is None
        assert dict(h.calls) == {"a1": 1, "a3": 1, "b2": 1}  # the handler never saw a skip

    # 3. Stream versions ---------------------------------------------------------------------
    async def test_stream_version_not_above_applied_is_skipped_and_settled(
        self, h: AgentHarness
    ) -> None:
        a, b = key_on(0, 2), key_on(1, 2)
        await h.start(log_app(h))
        for event in (
            ev(a, "a-v1", version=1),
            ev(a, "a-v2", version=2),
            ev(a, "a-v2-dup", version=2),  # duplicate within a batch
            ev(b, "b-v5", version=5),  # versions are per stream
        ):
            await h.send(event)
        assert await h.settle()
        for event in (
            ev(a, "a-v2-again", version=2),  # duplicate in a later batch (committed state)
            ev(a, "a-v1-older", version=1),
            ev(a, "a-v3", version=3),
            ev(a, "a-none-1"),  # no streamversion: always applied
            ev(a, "a-none-2"),
            ev(b, "b-v4", version=4),
            ev(b, "b-v6", version=6),
        ):
            await h.send(event)
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("log", a) == logged("a-v1", "a-v2", "a-v3", "a-none-1", "a-none-2")
        assert await h.table("log", b) == logged("b-v5", "b-v6")
        skipped = ("a-v2-dup", "a-v2-again", "a-v1-older", "b-v4")
        assert not any(h.calls[name] for name in skipped)  # the guard runs before the handler

    # 4. NOT_DELIVERABLE under Park ------------------------------------------------------------
    async def test_not_deliverable_is_parked_with_reason_and_the_partition_goes_on(
        self, h: AgentHarness
    ) -> None:
        await h.start(log_app(h, on_failure=Park(h.name("in.parked"))))
        oid = "order-bad"
        p = partition_for(oid.encode(), 2)
        good = [ev(oid, f"good-{i}") for i in range(3)]
        _, _, good_headers = codec.encode(good[0])
        no_stream_id = [(n, v) for n, v in good_headers if n != "ce_streamid"]
        raw = [
            (b"plain text, not a CloudEvent", [("x-trace", b"\xff")]),
            (b"{not json", good_headers),  # application/json, invalid JSON
            (b"{}", no_stream_id),  # a CloudEvent without a stream id (nor a subject)
        ]
        await h.send(good[0])
        for value, headers in raw:
            await h.send_raw(value, key=oid.encode(), headers=headers)
        await h.send(good[1])
        await h.send(good[2])
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("log", oid) == logged("good-0", "good-1", "good-2")
        assert dict(h.calls) == {"good-0": 1, "good-1": 1, "good-2": 1}

        parked = await h.parked(h.name("in.parked"))
        assert [r.value for r in parked] == [value for value, _ in raw]
        assert all(r.key == oid.encode() for r in parked)
        assert "not a CloudEvent" in parked[0].reason
        assert "not valid JSON" in parked[1].reason
        assert "no stream id" in parked[2].reason
        assert [r.source for r in parked] == [
            f"{h.topic}/{p}/{await h.position_of(i)}" for i in (1, 2, 3)
        ]
        assert all(r.headers["streamapp-agent"] == AGENT.encode() for r in parked)
        assert parked[0].headers["x-trace"] == b"\xff"  # the original headers travel along
        assert parked[2].headers["ce_id"] == good[0].id.encode()

    async def test_data_is_decoded_where_first_read_bad_json_there_is_not_deliverable(
        self, h: AgentHarness
    ) -> None:
        """A CloudEvent's attributes decode up front, its data when the handler first
        reads it: bad JSON read after a table write is NOT_DELIVERABLE there, with its
        reason, under the agent's policy (parked), the write rolled back, the partition
        going on; an event whose data the handler never reads is applied, undecoded."""
        await h.start(data_app(h, on_failure=Park(h.name("in.parked"))))
        oid = "order-data"
        reads = ev(oid, "reads-0", type="reads")
        _, _, reads_headers = codec.encode(reads)
        bad_read = [(n, b"bad-read" if n == "ce_id" else v) for n, v in reads_headers]
        _, _, skips_headers = codec.encode(ev(oid, "skips", type="skips"))
        bad_unread = [(n, b"bad-unread" if n == "ce_id" else v) for n, v in skips_headers]
        await h.send(reads)
        await h.send_raw(b"{not json", key=oid.encode(), headers=bad_read)
        await h.send_raw(b"{not json", key=oid.encode(), headers=bad_unread)
        await h.send(ev(oid, "reads-1", type="reads"))
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("log", oid) == logged(
            "reads-0:reads-0", "bad-unread:-", "reads-1:reads-1"
        )
        (parked,) = await h.parked(h.name("in.parked"))
        assert parked.value == b"{not json"
        assert "not valid JSON" in parked.reason
        assert "bad-read" in parked.reason  # the event it names
        p = partition_for(oid.encode(), 2)
        assert parked.source == f"{h.topic}/{p}/{await h.position_of(1)}"

    # 5. Handler raises under Park ------------------------------------------------------------
    async def test_handler_error_is_parked_its_writes_rolled_back_and_the_partition_goes_on(
        self, h: AgentHarness
    ) -> None:
        await self.handler_error_is_parked(h, a2_version=2)

    async def handler_error_is_parked(self, h: AgentHarness, *, a2_version: int) -> None:
        """``a2_version``: 2 (the parked event's version, which must not be recorded) where
        the transport lets a stream version repeat."""
        a, b = key_on(0, 2), key_on(1, 2)

        async def fail(event: Event, view: TableView[Any]) -> None:
            if event.type == "boom":
                raise RuntimeError(f"boom {event.id}")

        await h.start(log_app(h, on_failure=Park(h.name("in.parked")), fail=fail))
        sent = [
            ev(a, "a1", version=1),
            ev(a, "a-boom", version=2, type="boom"),
            ev(a, "a2", version=a2_version),  # the failed event's version was not recorded
            ev(a, "a3", version=a2_version + 1),
            ev(b, "b-boom", type="boom"),
            ev(b, "b1"),
        ]
        for event in sent:
            await h.send(event)
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("log", a) == logged("a1", "a2", "a3")
        assert await h.table("log", b) == logged("b1")
        assert h.calls["a-boom"] == h.calls["b-boom"] == 1  # parked, not retried

        parked = await h.parked(h.name("in.parked"))
        by_id = {h.parked_event(r).id: r for r in parked}
        assert sorted(by_id) == ["a-boom", "b-boom"]
        assert len(parked) == 2
        assert by_id["a-boom"].reason == "RuntimeError: boom a-boom"
        assert by_id["b-boom"].reason == "RuntimeError: boom b-boom"
        a_at, b_at = await h.position_of(1), await h.position_of(4)
        assert by_id["a-boom"].source == f"{h.topic}/{partition_for(a.encode(), 2)}/{a_at}"
        assert by_id["b-boom"].source == f"{h.topic}/{partition_for(b.encode(), 2)}/{b_at}"
        assert by_id["a-boom"].value == await h.value_of(1)
        assert h.parked_event(by_id["a-boom"]).data == {"name": "a-boom"}
        assert by_id["a-boom"].key == a.encode()

    # 6. Redeliver ---------------------------------------------------------------------------
    async def test_redeliver_fails_twice_then_applies_once_other_partition_not_held(
        self, h: AgentHarness
    ) -> None:
        stuck, other = key_on(0, 2), key_on(1, 2)
        others = [f"o{i}" for i in range(20)]
        others_done_at_success: list[int] = []

        async def fail(event: Event, view: TableView[Any]) -> None:
            if event.id != "flaky":
                return
            if h.calls["flaky"] <= 2:
                raise ConnectionError("transient")  # after the write: rolled back
            others_done_at_success.append(sum(1 for o in others if h.calls[o]))

        pause = h.redeliver_pause_s
        await h.start(log_app(h, on_failure=Redeliver(pause_s=pause), fail=fail))
        await h.send(ev(stuck, "s1"))
        await h.send(ev(stuck, "flaky"))
        await h.send(ev(stuck, "s3"))
        for name in others:
            await h.send(ev(other, name))
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("log", stuck) == logged("s1", "flaky", "s3")
        assert await h.table("log", other) == logged(*others)
        assert h.calls["flaky"] == 3
        assert h.calls["s1"] == h.calls["s3"] == 1  # the settled prefix is not redelivered
        assert all(h.calls[o] == 1 for o in others)
        assert len(others_done_at_success) == 1
        self.assert_other_partition_not_held(others_done_at_success[0], len(others))

    def assert_other_partition_not_held(self, done_at_success: int, total: int) -> None:
        """Partitions run side by side: the other one finished during the pauses."""
        assert done_at_success == total

    # 6b. Bounded Redeliver ------------------------------------------------------------------
    async def test_bounded_redeliver_parks_after_max_attempts_and_the_partition_goes_on(
        self, h: AgentHarness
    ) -> None:
        """Redeliver(max_attempts=3, fallback=Park(...)): three attempts, pauses doubling
        from pause_s, then the fallback parks it with why; later records of the partition
        are applied, and the next failing record gets its own three attempts."""
        stuck, other = key_on(0, 2), key_on(1, 2)
        tried: dict[str, list[float]] = {}

        async def fail(event: Event, view: TableView[Any]) -> None:
            if event.type == "poison":
                tried.setdefault(event.id, []).append(time.monotonic())
                raise ValueError(f"poison {event.id}")

        parking = h.name("in.parked")
        policy = Redeliver(pause_s=0.2, max_attempts=3, fallback=Park(parking))
        await h.start(log_app(h, on_failure=policy, fail=fail))
        sent = [
            ev(stuck, "s1"),
            ev(stuck, "p1", type="poison"),
            ev(stuck, "s2"),
            ev(stuck, "p2", type="poison"),
            ev(stuck, "s3"),
            ev(other, "o1"),
        ]
        for event in sent:
            await h.send(event)
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("log", stuck) == logged("s1", "s2", "s3")  # writes rolled back
        assert await h.table("log", other) == logged("o1")
        assert h.calls["p1"] == h.calls["p2"] == 3  # each counted on its own
        assert h.calls["s1"] == h.calls["s2"] == h.calls["s3"] == h.calls["o1"] == 1

        parked = await h.parked(parking)
        assert [h.parked_event(r).id for r in parked] == ["p1", "p2"]
        assert [r.reason for r in parked] == [
            "gave up after 3 attempts: ValueError: poison p1",
            "gave up after 3 attempts: ValueError: poison p2",
        ]
        p = partition_for(stuck.encode(), 2)
        assert [r.source for r in parked] == [
            f"{h.topic}/{p}/{await h.position_of(i)}" for i in (1, 3)
        ]
        assert parked[0].value == await h.value_of(1)
        if h.redeliver_pause_s is not None:  # a transport that pauses: 0.2 s, then 0.4 s
            gaps = [b - a for a, b in itertools.pairwise(tried["p1"])]
            assert gaps[0] >= 0.2 * 0.9, gaps
            assert gaps[1] >= 0.4 * 0.9, gaps

    # 7. A write to another partition's key -------------------------------------------------
    async def test_foreign_key_write_fails_and_is_parked_nothing_written(
        self, h: AgentHarness
    ) -> None:
        own, foreign = key_on(0, 2), key_on(1, 2)

        async def fail(event: Event, view: TableView[Any]) -> None:
            if event.type == "cross":
                view[foreign] = {"n": 99, "seen": ["written from partition 0"]}

        await h.start(log_app(h, on_failure=Park(h.name("in.parked")), fail=fail))
        await h.send(ev(own, "own-1"))
        await h.send(ev(own, "cross-1", type="cross"))
        await h.send(ev(own, "own-2"))
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("log", own) == logged("own-1", "own-2")  # own write rolled back
        assert await h.table("log", foreign) is None
        assert h.calls["cross-1"] == 1
        (parked,) = await h.parked(h.name("in.parked"))
        assert h.parked_event(parked).id == "cross-1"
        assert parked.reason.startswith(
            f"ForeignKeyError: table 'log': key {foreign!r} belongs to partition 1, "
            "but this event is handled in partition 0."
        )
        assert parked.source == f"{h.topic}/0/{await h.position_of(1)}"

    # 8. Batch budget ----------------------------------------------------------------------
    async def test_batch_budget_commits_a_slow_batch_in_parts_exactly(
        self, h: AgentHarness
    ) -> None:
        n = 60
        app = h.new_app(batch_budget_ms=30)
        topic = app.topic(h.name("in"), partitions=1)
        seen: Table[int] = Table("seen")

        keys = ("k0", "k1", "k2")
        samples: list[tuple[int, int, int]] = []  # (sent, unsettled at source, in table)
        sent = 0

        async def sample_once() -> None:
            was_sent = sent  # then the source, then the (later) table
            behind = await h.unsettled()
            applied = [await h.table("seen", k) for k in keys]
            samples.append((was_sent, behind, sum(v or 0 for v in applied)))

        @app.agent(topic, tables=[seen], name="slow")
        async def slow(event: Event, counts: TableView[int]) -> None:
            h.calls[event.id] += 1
            await sample_once()  # seen by the handler itself: a loaded machine cannot hide it
            await asyncio.sleep(0.01)  # ~3 events a budget: about 20 parts
            sid = event.stream_id
            assert sid is not None
            counts[sid] = counts.get(sid, 0) + 1

        await h.start(app)
        for i in range(n):
            await h.send(ev(keys[i % 3], f"e{i}"))
            sent += 1

        done = asyncio.Event()

        async def sample() -> None:
            while not done.is_set():  # ends with the settle below, bounded by its own wait
                await sample_once()
                await asyncio.sleep(0.005)

        sampler = asyncio.create_task(sample())
        try:
            assert await h.settle()
        finally:
            done.set()
            await sampler
        assert await h.unsettled() == 0
        assert [await h.table("seen", k) for k in keys] == [20, 20, 20]
        assert sorted(h.calls) == sorted(f"e{i}" for i in range(n))
        assert set(h.calls.values()) == {1}  # a cut is not a failure: nothing re-handled
        partial = {behind for was_sent, behind, _ in samples if was_sent == n and 0 < behind < n}
        assert len(partial) >= 2, samples  # settled in several parts, not once at the end
        # never settled before durable, on every transport alike: the table holds at least
        # what the source settled (an agent with tables settles after its store write)
        early = [(s, b, a) for s, b, a in samples if a < s - b]
        assert not early, (early[:5], len(samples))
        assert not h.early_settles, h.early_settles[:5]  # each settle, at its moment (Kafka)
        if isinstance(h, KafkaHarness):
            assert h.settles_watched >= len(partial), h.settles_watched  # it did watch them

    # 9. No tables ------------------------------------------------------------------------------
    async def test_agent_without_tables_sees_every_event(self, h: AgentHarness) -> None:
        await self.stateless_sees_every_event(h, a_version=1)

    async def stateless_sees_every_event(self, h: AgentHarness, *, a_version: int | None) -> None:
        """``a_version``: the version every event of stream ``a`` carries (1: repeated,
        which an agent without tables must not guard against)."""
        app = h.new_app()
        topic = app.topic(h.name("in"), partitions=2)
        seen: dict[str, list[str]] = {}

        @app.agent(topic, name="stateless")
        async def stateless(event: Event) -> None:
            h.calls[event.id] += 1
            sid = event.stream_id
            assert sid is not None
            seen.setdefault(sid, []).append(event.data["name"])

        await h.start(app)
        a, b = key_on(0, 2), key_on(1, 2)
        expected = {a: [f"a{i}" for i in range(15)], b: [f"b{i}" for i in range(15)]}
        for i in range(15):
            await h.send(ev(a, f"a{i}", version=a_version))  # no table: no version guard
            await h.send(ev(b, f"b{i}"))
        assert await h.settle()
        assert await h.unsettled() == 0
        assert sorted(h.calls) == sorted(expected[a] + expected[b])
        assert {k: list(dict.fromkeys(v)) for k, v in seen.items()} == expected  # in order
        if h.stateless_calls_exact:
            assert seen == expected
            assert set(h.calls.values()) == {1}


class TestMemory(AgentContract):
    @pytest.fixture
    async def h(self) -> AsyncIterator[AgentHarness]:
        harness = MemoryHarness()
        try:
            yield harness
        finally:
            await harness.stop()

    def assert_other_partition_not_held(self, done_at_success: int, total: int) -> None:
        """The memory broker drains one partition at a time (no "meanwhile"): the other
        partition is drained whole, before or after, never cut by the retries."""
        assert done_at_success in (0, total)


@pytest.mark.integration
class TestKafka(AgentContract):
    @pytest.fixture
    async def h(self, kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = KafkaHarness(kafka_bootstrap, tmp_path / "data")
        try:
            yield harness
        finally:
            await harness.stop()


class TestEventStore(AgentContract):
    """The event store as the only source (STREAMAPP_BROKER=none), on SQLite.

    Where the store refuses what a broker test sends (records that are not CloudEvents,
    a stream version that repeats or skips), the test is overridden here by one that
    asserts the store's rule instead: the append is refused with its error and nothing
    is appended, and what was appended applies exactly once. Nothing is skipped.
    """

    @pytest.fixture
    async def h(self, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = StoreHarness(f"sqlite:///{tmp_path}/events.db", tmp_path / "data")
        try:
            yield harness
        finally:
            await harness.stop()

    @staticmethod
    async def refused(h: AgentHarness, event: Event, error: type[Exception], match: str) -> None:
        """``event`` is refused by the store with ``error`` and nothing is appended."""
        assert isinstance(h, StoreHarness)
        head = await h.store.head()
        with pytest.raises(error, match=match):
            await h.send(event)
        assert await h.store.head() == head

    # 3 ----------------------------------------------------------------------------------
    async def test_stream_version_not_above_applied_is_skipped_and_settled(
        self, h: AgentHarness
    ) -> None:
        """Overridden: the store never holds a repeated or older stream version, so the
        agent's guard is not what stops one here. The store's rule is asserted instead:
        a ``streamversion`` that is not the stream's next one (a duplicate, an older one,
        a gap, a first event at version 5) is refused with ConcurrencyError naming the
        stream and both versions, nothing is appended; every appended event applies
        exactly once, in order, events without a version getting the next one."""
        assert isinstance(h, StoreHarness)
        a, b = key_on(0, 2), key_on(1, 2)
        await h.start(log_app(h))
        await h.send(ev(a, "a-v1", version=1))
        await h.send(ev(a, "a-v2", version=2))
        await self.refused(
            h,
            ev(a, "a-v2-dup", version=2),
            ConcurrencyError,
            "expected version 1, actual version 2",
        )
        await self.refused(
            h, ev(b, "b-v5", version=5), ConcurrencyError, "expected version 4, actual version 0"
        )
        await h.send(ev(b, "b-v1", version=1))
        assert await h.settle()
        await self.refused(h, ev(a, "a-v2-again", version=2), ConcurrencyError, "actual version 2")
        await self.refused(h, ev(a, "a-v1-older", version=1), ConcurrencyError, "actual version 2")
        await h.send(ev(a, "a-v3", version=3))
        await h.send(ev(a, "a-none-1"))
        await h.send(ev(a, "a-none-2"))
        await self.refused(
            h, ev(b, "b-v4", version=4), ConcurrencyError, "expected version 3, actual version 1"
        )
        await h.send(ev(b, "b-v2", version=2))
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("log", a) == logged("a-v1", "a-v2", "a-v3", "a-none-1", "a-none-2")
        assert await h.table("log", b) == logged("b-v1", "b-v2")
        assert [r.version for r in await h.store.read_stream(a)] == [1, 2, 3, 4, 5]
        assert dict(h.calls) == dict.fromkeys(
            ("a-v1", "a-v2", "b-v1", "a-v3", "a-none-1", "a-none-2", "b-v2"), 1
        )

    # 4 ----------------------------------------------------------------------------------
    async def test_not_deliverable_is_parked_with_reason_and_the_partition_goes_on(
        self, h: AgentHarness
    ) -> None:
        """Overridden: the store takes CloudEvents with a stream id only, so the broker
        test's raw records never become deliveries. Asserted instead: each is refused at
        the append with the reason a broker's decoder parks it for, nothing is appended
        and nothing parked; the good events around them apply exactly once. A stored row
        that does not decode can only be written around the store:
        :meth:`test_a_stored_row_that_does_not_decode_is_parked` parks it."""
        assert isinstance(h, StoreHarness)
        await h.start(log_app(h, on_failure=Park(h.name("in.parked"))))
        oid = "order-bad"
        good = [ev(oid, f"good-{i}") for i in range(3)]
        _, _, good_headers = codec.encode(good[0])
        no_stream_id = [(n, v) for n, v in good_headers if n != "ce_streamid"]
        fresh_id = [(n, b"bad-json" if n == "ce_id" else v) for n, v in good_headers]
        raw = [
            (
                b"plain text, not a CloudEvent",
                [("x-trace", b"\xff")],
                DecodeError,
                "not a CloudEvent",
            ),
            # its own id: the append reads its data (one with good-0's id is a duplicate,
            # skipped before its data is read)
            (b"{not json", fresh_id, DecodeError, "not valid JSON"),
            (b"{}", no_stream_id, InvalidEventError, "no stream id"),
        ]
        await h.send(good[0])
        for value, headers, error, why in raw:
            head = await h.store.head()
            with pytest.raises(error, match=why):
                await h.send_raw(value, key=oid.encode(), headers=headers)
            assert await h.store.head() == head
        await h.send(good[1])
        await h.send(good[2])
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("log", oid) == logged("good-0", "good-1", "good-2")
        assert dict(h.calls) == {"good-0": 1, "good-1": 1, "good-2": 1}
        assert [e.stream_version for e in (r.event() for r in await h.store.read_stream(oid))] == [
            1,
            2,
            3,
        ]
        assert await h.parked(h.name("in.parked")) == []

    async def test_data_is_decoded_where_first_read_bad_json_there_is_not_deliverable(
        self, h: AgentHarness
    ) -> None:
        """Overridden: the store keeps structured JSON, so it refuses an event whose data
        is not JSON at the append (with the reason a broker's handler parks it for) and
        nothing is appended; a handler that never reads its data applies it all the same."""
        assert isinstance(h, StoreHarness)
        await h.start(data_app(h, on_failure=Park(h.name("in.parked"))))
        oid = "order-data"
        for kind in ("reads", "skips"):
            _, _, headers = codec.encode(ev(oid, f"bad-{kind}", type=kind))
            head = await h.store.head()
            with pytest.raises(DecodeError, match="not valid JSON"):
                await h.send_raw(b"{not json", key=oid.encode(), headers=headers)
            assert await h.store.head() == head
        await h.send(ev(oid, "reads-0", type="reads"))
        await h.send(ev(oid, "skips-0", type="skips"))
        assert await h.settle()
        assert await h.table("log", oid) == logged("reads-0:reads-0", "skips-0:-")
        assert await h.parked(h.name("in.parked")) == []

    async def test_a_stored_row_that_does_not_decode_is_parked(self, h: AgentHarness) -> None:
        """Embedded: a row written around the store's checks (another tool, a damaged
        file) is NOT_DELIVERABLE; under Park it goes to ``streamapp_parked`` with its
        reason and global store position, and its partition goes on."""
        assert isinstance(h, StoreHarness)
        await h.start(log_app(h, on_failure=Park(h.name("in.parked"))))
        oid = "order-bad"
        p = partition_for(oid.encode(), 2)
        await h.send(ev(oid, "good-0"))
        await h.write_around_store(oid, b"{not json")
        await h.send(ev(oid, "good-2"))
        assert await h.settle()
        assert await h.unsettled() == 0
        assert await h.table("log", oid) == logged("good-0", "good-2")
        (parked,) = await h.parked(h.name("in.parked"))
        assert parked.value == b"{not json"
        assert parked.key == oid.encode()
        assert "not valid JSON" in parked.reason
        assert parked.source == f"{h.topic}/{p}/{await h.position_of(1)}"
        assert parked.headers["streamapp-agent"] == AGENT.encode()

    # 5 ----------------------------------------------------------------------------------
    async def test_handler_error_is_parked_its_writes_rolled_back_and_the_partition_goes_on(
        self, h: AgentHarness
    ) -> None:
        """Overridden in one point: the parked event keeps its stream version in the
        store, so the next event of its stream is version 3 (the store refuses a second
        version 2: asserted); the rest is the contract's test."""
        await self.handler_error_is_parked(h, a2_version=3)
        a = key_on(0, 2)
        await self.refused(h, ev(a, "a-v2-again", version=2), ConcurrencyError, "actual version 4")

    # 6, the pause -----------------------------------------------------------------------
    async def test_redeliver_waits_the_policy_pause_between_attempts(self, h: AgentHarness) -> None:
        """Embedded, for now: Redeliver(pause_s=0.6) retries no sooner than 0.6 s."""
        attempts: list[float] = []

        async def fail(event: Event, view: TableView[Any]) -> None:
            attempts.append(time.monotonic())
            if len(attempts) <= 2:
                raise ConnectionError("transient")

        await h.start(log_app(h, on_failure=Redeliver(pause_s=0.6), fail=fail))
        await h.send(ev(key_on(0, 2), "flaky"))
        assert await h.settle()
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        assert len(gaps) == 2
        assert min(gaps) >= 0.6 * 0.9, gaps

    # 9 ----------------------------------------------------------------------------------
    async def test_agent_without_tables_sees_every_event(self, h: AgentHarness) -> None:
        """Overridden in one point: the store refuses a repeated ``streamversion``
        (asserted), so stream ``a`` is sent without versions; the rest is the contract's
        test."""
        await self.stateless_sees_every_event(h, a_version=None)
        a = key_on(0, 2)
        await self.refused(h, ev(a, "a-again", version=1), ConcurrencyError, "actual version 15")


@pytest.mark.integration
class TestEventStorePostgres(TestEventStore):
    """The same, on a PostgreSQL store (a schema of its own per test)."""

    @pytest.fixture
    async def h(self, pg_url_factory: PgUrlFactory, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        async with pg_url_factory() as url:
            harness = StoreHarness(url, tmp_path / "data")
            try:
                yield harness
            finally:
                await harness.stop()


@pytest.mark.integration
class TestRabbitMQ(AgentContract):
    @pytest.fixture
    async def h(self, services: Services, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = RabbitHarness(services.amqp, tmp_path)
        try:
            yield harness
        finally:
            await harness.stop()

    async def test_redeliver_goes_back_to_the_broker_and_returns_flagged(
        self, h: AgentHarness
    ) -> None:
        """RabbitMQ's Redeliver is a requeue at the broker (never a drop): the message
        comes back with the redelivered flag, and the partition goes on in order."""
        key = key_on(0, 1)

        async def fail(event: Event, view: TableView[Any]) -> None:
            if event.id == "flaky" and h.calls["flaky"] == 1:
                raise ConnectionError("transient")

        await h.start(log_app(h, partitions=1, on_failure=Redeliver(pause_s=0.2), fail=fail))
        for name in ("a", "flaky", "b"):
            await h.send(ev(key, name))
        assert await h.settle()
        assert await h.table("log", key) == logged("a", "flaky", "b")
        assert h.calls == {"a": 1, "flaky": 2, "b": 1}
        assert isinstance(h, RabbitHarness)
        assert h.redelivered() >= 2  # flaky and b were requeued, and came back flagged
