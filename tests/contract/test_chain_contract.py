"""The retry chain contract: one suite of the chain's shared behaviour, run over every
transport that has one (Kafka, RabbitMQ, the in-memory broker; the event store alone
refuses ``Retry``).

What every transport promises (docs/failures.md, "The retry chain"): a failing record is tried in
place after each of ``intervals``; then a copy goes to ``{topic}-retry`` with the chain's
headers, and the relay republishes it to its origin topic, same partition, not before
its ``x-deliver-at`` (hop ``k`` waits ``backoff[k - 1]``), without ``x-deliver-at`` and
``x-origin-topic``; a success ends the chain; after ``max_reconsume + 1`` failures the
record goes to ``{topic}-dlq`` with the reason and its origin. Every other header is
kept at every step, the records behind a failing one are not held, and due copies come
back in due order. Broker-specific cases (relay metrics and status, crashes, missing
queues, unconfirmed copies) stay in ``tests/integration``.

Nothing here waits on a sleep: each test waits (bounded) for the state it then checks,
and "nothing more comes" holds because every record is settled and no copy is left.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import Services

from streamapp import App, Event, Park, Retry, Table, TableView

from .harness import AgentHarness
from .kafka_harness import KafkaHarness
from .memory_harness import MemoryHarness
from .rabbit_harness import RabbitHarness
from .test_agent_contract import key_on

CHAIN = ("x-reconsume", "x-retry-hop", "x-deliver-at", "x-origin-topic", "x-retry-agent")


def business(headers: dict[str, bytes]) -> dict[str, bytes]:
    """The record's own headers: the CloudEvent's and the producer's, no chain header."""
    return {k: v for k, v in headers.items() if not k.startswith("x-")}


def chain_app(
    h: AgentHarness, policy: Retry, *, fails: int | None, tables: bool = True
) -> tuple[App, list[tuple[str, float]]]:
    """One agent ``summer`` summing ``data.n`` per stream (table ``sums``); an event of
    type ``bad`` raises on its first ``fails`` attempts (None: always), after its write
    (rolled back). Returns the app and every call as ``(event id, transport clock ms)``."""
    app = h.new_app()
    topic = app.topic(h.name("in"), partitions=2)
    sums: Table[int] = Table("sums")
    calls: list[tuple[str, float]] = []

    async def handle(event: Event, view: TableView[int] | None) -> None:
        h.calls[event.id] += 1
        calls.append((event.id, h.clock_ms()))
        sid = event.stream_id
        assert sid is not None
        if view is not None:
            view[sid] = view.get(sid, 0) + event.data["n"]
        if event.type == "bad" and (fails is None or h.calls[event.id] <= fails):
            raise ValueError(f"bad {event.id}")

    if tables:

        @app.agent(topic, tables=[sums], on_failure=policy, name="summer")
        async def summer(event: Event, view: TableView[int]) -> None:
            await handle(event, view)

    else:

        @app.agent(topic, on_failure=policy, name="summer")
        async def plain(event: Event) -> None:
            await handle(event, None)

    return app, calls


def at(calls: list[tuple[str, float]], eid: str, attempt: int) -> float:
    """The clock of ``eid``'s ``attempt``-th call (1-based)."""
    return [t for e, t in calls if e == eid][attempt - 1]


def bad(eid: str, sid: str = "s", n: int = 7, version: int | None = 1) -> Event:
    return Event.create("bad", stream_id=sid, data={"n": n}, id=eid, version=version)


def ok(eid: str, sid: str = "s", n: int = 1) -> Event:
    return Event.create("ok", stream_id=sid, data={"n": n}, id=eid)


class ChainContract:
    """The retry chain every transport with one must give. Subclasses provide ``h``."""

    @pytest.fixture
    def h(self) -> AgentHarness:
        raise NotImplementedError("a transport's subclass provides the harness")

    async def test_fails_five_times_then_succeeds_through_the_retry_topic(
        self, h: AgentHarness
    ) -> None:
        """Three failures in place (the first delivery, two inline retries), a copy to
        the retry topic with the chain's headers, back when due (hop 1: ``backoff[0]``),
        two more failures there, then a success: applied once, nothing dead-lettered."""
        policy = Retry(intervals=(0.1, 0.2), backoff=(0.4,))
        app, calls = chain_app(h, policy, fails=5)
        await h.start(app)
        source, retry, dlq = h.topic, f"{h.topic}-retry", f"{h.topic}-dlq"
        sent_ms = h.clock_ms()
        event = bad("flaky")
        await h.send(event)

        async def applied() -> bool:
            return h.calls["flaky"] == 6 and await h.table("sums", "s") == 7

        await h.until(applied, f"applied once after 5 failures ({h.calls})")
        assert await h.settle()  # the copy that came back is settled: nothing comes again
        assert h.calls["flaky"] == 6
        assert await h.table("sums", "s") == 7  # as if it ran once
        (copy,) = await h.crossed(retry)
        original, back = await h.crossed(source)
        assert copy.headers["x-reconsume"] == b"3"
        assert copy.headers["x-retry-hop"] == b"1"
        assert copy.headers["x-origin-topic"] == source.encode()
        assert copy.headers["x-retry-agent"] == b"summer"
        due = int(copy.headers["x-deliver-at"])
        assert due >= sent_ms + 400
        assert at(calls, "flaky", 4) >= due  # not run again before it was due
        assert business(copy.headers) == business(original.headers)  # the CloudEvent kept
        assert copy.headers["ce_id"] == b"flaky"
        assert (copy.key, copy.value, copy.partition) == (b"s", original.value, back.partition)
        assert back.headers["x-reconsume"] == b"3"
        assert back.headers["x-retry-hop"] == b"1"
        assert back.headers["x-retry-agent"] == b"summer"
        assert "x-deliver-at" not in back.headers
        assert "x-origin-topic" not in back.headers
        assert business(back.headers) == business(original.headers)
        assert (back.key, back.value, back.partition) == (b"s", original.value, original.partition)
        assert not await h.crossed(dlq)
        assert h.metric("streamapp_retried", "summer") == 1
        assert h.metric("streamapp_failed_attempts", "summer") == 5
        assert h.metric("streamapp_dead_lettered", "summer") is None

    async def test_a_poison_record_is_dead_lettered_and_does_not_hold_its_partition(
        self, h: AgentHarness
    ) -> None:
        """``max_reconsume=7``: eight failures in all over two round trips (hop 2 waits
        ``backoff[1]``), then the dead-letter topic with reason and origin; the records
        behind it ran once its first copy was made."""
        policy = Retry(intervals=(0.1, 0.2), max_reconsume=7, backoff=(0.2, 0.4))
        app, calls = chain_app(h, policy, fails=None, tables=False)
        await h.start(app)
        key = key_on(1, 2)
        await h.send(bad("poison", key, version=None))
        for i in range(3):
            await h.send(ok(f"ok{i}", key))

        async def dead_lettered() -> bool:
            return len(await h.crossed(f"{h.topic}-dlq")) == 1

        await h.until(dead_lettered, f"dead-lettered ({h.calls})")
        assert await h.settle()
        assert h.calls["poison"] == 8  # max_reconsume + 1
        assert {h.calls[f"ok{i}"] for i in range(3)} == {1}
        order = [e for e, _ in calls]
        assert order[:6] == ["poison"] * 3 + ["ok0", "ok1", "ok2"]  # held 3 attempts only
        first, second = await h.crossed(f"{h.topic}-retry")
        assert [c.headers["x-reconsume"] for c in (first, second)] == [b"3", b"6"]
        assert [c.headers["x-retry-hop"] for c in (first, second)] == [b"1", b"2"]
        # x-deliver-at is whole milliseconds: 1 ms of slack for the truncation
        assert int(first.headers["x-deliver-at"]) >= at(calls, "poison", 3) + 200 - 1
        assert at(calls, "poison", 4) >= int(first.headers["x-deliver-at"])
        assert int(second.headers["x-deliver-at"]) >= at(calls, "poison", 6) + 400 - 1
        assert at(calls, "poison", 7) >= int(second.headers["x-deliver-at"])
        (dead,) = await h.crossed(f"{h.topic}-dlq")
        d = dead.headers
        assert d["x-reconsume"] == b"8"
        assert d["x-retry-hop"] == b"2"
        assert d["x-origin-topic"] == h.topic.encode()
        assert d["x-retry-agent"] == b"summer"
        assert d["x-dlq-reason"] == b"failed 8 times: ValueError: bad poison"
        assert d["x-origin"].startswith(f"{h.topic}/1/".encode())
        assert "x-deliver-at" not in d
        assert d["ce_id"] == b"poison"
        assert dead.key == key.encode()
        assert h.metric("streamapp_retried", "summer") == 2
        assert h.metric("streamapp_dead_lettered", "summer") == 1
        assert h.metric("streamapp_failed_attempts", "summer") == 8

    async def test_a_success_on_hop_2_ends_the_chain(self, h: AgentHarness) -> None:
        """Six failures (two round trips), a success on the first attempt of hop 2:
        applied once, no third copy, nothing dead-lettered."""
        policy = Retry(intervals=(0.05, 0.05), backoff=(0.1, 0.2))
        app, _ = chain_app(h, policy, fails=6)
        await h.start(app)
        await h.send(bad("flaky", n=5))

        async def applied() -> bool:
            return h.calls["flaky"] == 7 and await h.table("sums", "s") == 5

        await h.until(applied, f"applied on hop 2 ({h.calls})")
        assert await h.settle()
        copies = await h.crossed(f"{h.topic}-retry")
        assert [c.headers["x-retry-hop"] for c in copies] == [b"1", b"2"]
        back = [r for r in await h.crossed(h.topic) if "x-retry-hop" in r.headers]
        assert [r.headers["x-retry-hop"] for r in back] == [b"1", b"2"]
        assert not await h.crossed(f"{h.topic}-dlq")
        assert h.calls["flaky"] == 7
        assert await h.table("sums", "s") == 5

    async def test_due_copies_come_back_in_due_order_per_partition(self, h: AgentHarness) -> None:
        """Three records of one partition each fail once (no inline retries): their
        copies are due in the order they were made; each comes back once, not before it
        is due, and in due order where the transport's relay keeps it (Kafka, memory:
        one relay loop per partition; RabbitMQ republishes each held copy on its own
        when due, so copies due together may cross)."""
        policy = Retry(intervals=(), backoff=(1,))
        app, calls = chain_app(h, policy, fails=1, tables=False)
        await h.start(app)
        key = key_on(0, 2)
        names = ["b1", "b2", "b3"]
        for name in names:
            await h.send(bad(name, key, version=None))

        async def done() -> bool:
            return all(h.calls[n] == 2 for n in names)

        await h.until(done, f"each applied on its copy ({h.calls})")
        assert await h.settle()
        copies = await h.crossed(f"{h.topic}-retry")
        assert [c.headers["ce_id"] for c in copies] == [n.encode() for n in names]
        dues = [int(c.headers["x-deliver-at"]) for c in copies]
        assert dues == sorted(dues)
        order = [e for e, _ in calls]
        assert order[:3] == names  # the first attempts, none held behind another's copy
        for name, due in zip(names, dues, strict=True):
            assert at(calls, name, 2) >= due
        if h.due_order_kept:
            assert order[3:] == names
        else:
            assert sorted(order[3:]) == names
        assert not await h.crossed(f"{h.topic}-dlq")

    async def test_without_a_retry_topic_inline_retries_then_dead_letter(
        self, h: AgentHarness
    ) -> None:
        """``retry_suffix=""``: no retry topic; the inline retries, then the dead-letter
        topic at hop 0."""
        policy = Retry(intervals=(0.05,), retry_suffix="")
        app, _ = chain_app(h, policy, fails=None, tables=False)
        assert f"{h.name('in')}-retry" not in {p.name for p in app.topic_plan()}
        await h.start(app)
        await h.send(bad("p", version=None))

        async def dead_lettered() -> bool:
            return len(await h.crossed(f"{h.topic}-dlq")) == 1

        await h.until(dead_lettered, f"dead-lettered ({h.calls})")
        assert await h.settle()
        (dead,) = await h.crossed(f"{h.topic}-dlq")
        assert dead.headers["x-reconsume"] == b"2"
        assert dead.headers["x-retry-hop"] == b"0"
        assert h.calls["p"] == 2

    async def test_a_record_that_does_not_decode_follows_the_chain_headers_kept(
        self, h: AgentHarness
    ) -> None:
        """Not a CloudEvent: the same chain (NOT_DELIVERABLE counts as a failure), every
        header of the record kept on the retry copy, back, and on the dead letter."""
        policy = Retry(intervals=(), max_reconsume=1, backoff=(0.1,))
        app, _ = chain_app(h, policy, fails=None, tables=False)
        await h.start(app)
        await h.send_raw(b"not an event", key=b"k", headers=[("biz", b"1"), ("trace", b"t")])

        async def dead_lettered() -> bool:
            return len(await h.crossed(f"{h.topic}-dlq")) == 1

        await h.until(dead_lettered, "dead-lettered")
        assert await h.settle()
        (copy,) = await h.crossed(f"{h.topic}-retry")
        (dead,) = await h.crossed(f"{h.topic}-dlq")
        original, back = await h.crossed(h.topic)
        for record in (copy, back, dead):
            assert business(record.headers) == business(original.headers)
            assert business(record.headers)["trace"] == b"t"
            assert record.value == b"not an event"
        assert dead.headers["x-dlq-reason"].startswith(b"failed 2 times: not a CloudEvent")
        assert not set(CHAIN) & set(original.headers)


class NarrowTopicsContract:
    """Dead-letter and parking topics with one partition (one queue), on the brokers,
    where a user may make them so: a copy from partition 1 goes to partition 0."""

    async def test_a_one_partition_dead_letter_topic_takes_copies_from_partition_1(
        self, h: AgentHarness
    ) -> None:
        policy = Retry(intervals=(0.05,), max_reconsume=1, backoff=(0.2,))
        app, _ = chain_app(h, policy, fails=None, tables=False)
        h.narrowed = {f"{h.name('in')}-dlq"}
        await h.start(app)
        key = key_on(1, 2)
        await h.send(bad("poison", key, version=None))
        await h.send(ok("after", key))

        async def dead_lettered() -> bool:
            return len(await h.records(f"{h.topic}-dlq")) == 1 and h.calls["after"] == 1

        await h.until(dead_lettered, f"dead-lettered to the one partition ({h.calls})")
        assert await h.settle()
        (dead,) = await h.records(f"{h.topic}-dlq")
        assert dead.partition == 0
        assert dead.headers["x-origin"].startswith(f"{h.topic}/1/".encode())
        assert h.calls["poison"] == 2  # max_reconsume + 1
        assert h.calls["after"] == 1

    async def test_a_one_partition_parking_topic_takes_parks_from_partition_1(
        self, h: AgentHarness
    ) -> None:
        app = h.new_app()
        topic = app.topic(h.name("in"), partitions=2)
        parked = h.name("parked")

        @app.agent(topic, on_failure=Park(parked))
        async def picky(event: Event) -> None:
            h.calls[event.id] += 1
            if event.type == "bad":
                raise ValueError("cannot digest")

        h.narrowed = {parked}
        await h.start(app)
        key = key_on(1, 2)
        await h.send(bad("poison", key, version=None))
        await h.send(ok("after", key))

        async def done() -> bool:
            return len(await h.parked(parked)) == 1 and h.calls["after"] == 1

        await h.until(done, f"parked to the one partition ({h.calls})")
        (copy,) = await h.parked(parked)
        assert copy.partition == 0
        assert copy.source.startswith(f"{h.topic}/1/")
        assert h.calls == Counter({"poison": 1, "after": 1})


class TestMemory(ChainContract):
    @pytest.fixture
    async def h(self) -> AsyncIterator[AgentHarness]:
        harness = MemoryHarness()
        try:
            yield harness
        finally:
            await harness.stop()


@pytest.mark.integration
class TestKafka(ChainContract, NarrowTopicsContract):
    @pytest.fixture
    async def h(self, kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = KafkaHarness(kafka_bootstrap, tmp_path / "data")
        try:
            yield harness
        finally:
            await harness.stop()


@pytest.mark.integration
class TestRabbitMQ(ChainContract, NarrowTopicsContract):
    @pytest.fixture
    async def h(self, services: Services, tmp_path: Path) -> AsyncIterator[AgentHarness]:
        harness = RabbitHarness(services.amqp, tmp_path)
        try:
            yield harness
        finally:
            await harness.stop()
