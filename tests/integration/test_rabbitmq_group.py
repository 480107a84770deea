"""RabbitMQ workers as a group: partitions shared, moved and kept exact on a real broker.

The membership protocol (``streamapp/transports/rabbitmq/members.py``) hands partitions between
workers; single active consumer guards a partition when members disagree. Nothing is
mocked: the broker is the session's RabbitMQ, the store a SQLite file; the disagreement
is made by silencing one in-process member's heartbeats.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from streamapp import App, Event, FromEventStore, Table, TableView
from streamapp.transports.rabbitmq.members import RabbitMembership
from streamapp.transports.rabbitmq.source import RabbitSource
from streamapp.transports.rabbitmq.topology import create_topology
from streamapp.worker import Worker
from tests.conftest import Services
from tests.support.services import restart
from tests.support.waits import until as until_progress

from .harness import (
    StreamappProc,
    WorkerProc,
    append_to_store,
    around_traceback,
    order_events,
    processed,
    wait_exact,
    wait_group_ready,
    wait_ready,
    wait_statuses,
)
from .test_rabbitmq import depth, rabbit_env, topics_create

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 4


@pytest.fixture
def amqp(services: Services) -> str:
    return services.amqp


# --- in-process members -------------------------------------------------------------------


Calls = list[tuple[str, str]]
"""(member, event id) of every handler call."""


def group_app(ns: str, amqp: str, store: str, data: Path, name: str, calls: Calls) -> App:
    app = App(
        f"{ns}app",
        broker="rabbitmq",
        amqp_url=amqp,
        event_store=store,
        data_dir=data,
        web_port=0,
        poll_timeout_ms=200,
        amqp_heartbeat_ms=200,
        amqp_session_timeout_ms=1200,
    )
    counts: Table[dict[str, Any]] = Table("counts")

    @app.agent(
        app.topic(f"{ns}in", partitions=PARTITIONS), tables=[counts], history=FromEventStore()
    )
    async def count(event: Event, view: TableView[dict[str, Any]]) -> None:
        calls.append((name, event.id))
        key = event.stream_id
        assert key is not None
        old = view.get(key) or {"n": 0}
        view[key] = {"n": old["n"] + 1, "last": event.data["i"]}

    return app


class Member:
    """One in-process worker of the group, with its own data directory and id."""

    def __init__(self, ns: str, amqp: str, tmp: Path, name: str, calls: Calls) -> None:
        self.name = name
        store = f"sqlite:///{tmp / 'events.db'}"
        self.app = group_app(ns, amqp, store, tmp / name, name, calls)
        self.worker = Worker(self.app, self.app.settings())
        self.worker.id = name

    async def start(self) -> None:
        await self.worker.start()

    async def stop(self) -> None:
        await self.worker.stop()

    @property
    def source(self) -> RabbitSource:
        source = self.worker.source
        assert isinstance(source, RabbitSource)
        return source

    @property
    def group(self) -> RabbitMembership:
        membership = self.source.membership
        assert isinstance(membership, RabbitMembership)
        return membership

    def owned(self) -> set[int]:
        return {
            p for (_, p), task in self.source.assignment.tasks.items() if task.phase.value == "live"
        }

    def value(self, key: str) -> Any:
        """``key``'s committed value in this member's store, when it owns its partition."""
        _, task = self.source.assignment.owner_of("counts", key)
        if task is None or task.tables is None:
            return None
        return task.tables.view("counts").get(key)


async def until(check: Callable[[], bool], what: str, *members: Member) -> None:
    """Until ``check()`` holds; fails once nothing the members show moved for a minute
    (the partitions each holds and their phases, the events each applied)."""

    def moved() -> object:
        seen = []
        for m in members:
            tasks = m.source.assignment.tasks if m.worker.source is not None else {}
            phases = sorted((p, t.phase.value) for (_, p), t in tasks.items())
            applied = sum(t.counts.processed + t.counts.replayed for t in tasks.values())
            seen.append((tuple(phases), applied))
        return tuple(seen)

    await until_progress(check, what=what, progress=moved)


def events(n: int, keys: int, start: int = 0) -> list[Event]:
    return [
        Event.create("t", stream_id=f"k{(start + i) % keys}", source="tests", data={"i": start + i})
        for i in range(n)
    ]


async def run_forwarder(app: App) -> asyncio.Task[None]:
    """The store's forwarder, in-process, publishing to the app's topic."""
    from streamapp.catchup.forwarder import Forwarder, forwarded_topics
    from streamapp.cli.forward import forward_sink
    from streamapp.eventstore import open_store

    settings = app.settings()
    es = await open_store(settings.event_store)
    make_sink, encode = forward_sink(app, settings)
    forwarder = Forwarder(
        es,
        make_sink,
        forwarded_topics(app, settings),
        name="fwd",
        encode=encode,
        chunk=200,
        poll_interval_s=0.1,
    )

    async def run() -> None:
        try:
            await forwarder.run()
        finally:
            await es.close()

    return asyncio.create_task(run())


def expected_counts(evs: list[Event]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for e in evs:
        key = e.stream_id
        assert key is not None
        out[key] = {"n": out.get(key, {"n": 0})["n"] + 1, "last": e.data["i"]}
    return out


@dataclass
class Group:
    """Two in-process members a and b of one app (b not started), its store and the
    store's forwarder; ``calls`` records who applied which event."""

    a: Member
    b: Member
    calls: Calls
    store: str


@pytest.fixture
async def group(amqp: str, tmp_path: Path) -> AsyncIterator[Group]:
    ns = f"g{uuid.uuid4().hex[:6]}-"
    calls: Calls = []
    a, b = Member(ns, amqp, tmp_path, "a", calls), Member(ns, amqp, tmp_path, "b", calls)
    await create_topology(a.app, a.app.settings())
    fwd = await run_forwarder(a.app)
    try:
        yield Group(a, b, calls, a.app.settings().event_store)
    finally:
        fwd.cancel()
        await asyncio.gather(fwd, return_exceptions=True)
        for m in (b, a):
            if m.worker.source is not None:
                await m.stop()


async def test_a_partition_that_comes_back_replays_what_another_member_applied(
    group: Group,
) -> None:
    """A applies alone; B joins and applies half the keys; B leaves; A's state for B's
    partitions is stale unless its open replays the store: every key must be exact."""
    a, b, calls, store = group.a, group.b, group.calls, group.store
    await a.start()
    await until(lambda: a.owned() == set(range(PARTITIONS)), "a owns all", a, b)
    first, second, third = events(400, 40), events(400, 40, 400), events(400, 40, 800)
    await append_to_store(store, first)
    await until(lambda: len(calls) >= 400, "a applied the first events", a, b)
    await b.start()  # 1 -> 2: half the partitions move to b
    await until(
        lambda: len(a.owned()) == PARTITIONS // 2 and len(b.owned()) == PARTITIONS // 2,
        "the partitions are shared",
        a,
        b,
    )
    await append_to_store(store, second)
    await until(
        lambda: all(
            (a.value(k) or b.value(k) or {}).get("n") == 20 for k in expected_counts(first)
        ),
        "the second events applied",
        a,
        b,
    )
    by_b = {eid for who, eid in calls if who == "b"}
    assert {e.id for e in second} & by_b  # b applied some live events itself
    await b.stop()  # 2 -> 1: b's partitions come back to a, which had old state
    await until(lambda: a.owned() == set(range(PARTITIONS)), "a owns all again", a, b)
    await append_to_store(store, third)
    expected = expected_counts(first + second + third)
    await until(lambda: all(a.value(k) == v for k, v in expected.items()), "a exact", a, b)


async def test_members_that_disagree_apply_each_event_once(group: Group) -> None:
    """A hears nobody and says nothing (a partitioned member): B takes every partition
    too. Single active consumer delivers each queue to A only, so each live event is
    applied by one member; once A is heard again the members agree and stay exact."""
    a, b, calls, store = group.a, group.b, group.calls, group.store
    await a.start()
    await until(lambda: a.owned() == set(range(PARTITIONS)), "a owns all", a, b)
    group = a.group
    heard, send = group._heard, group._send

    async def mute(*, leaving: bool = False) -> None:
        return None

    group._heard = lambda *args: None  # type: ignore[method-assign]
    group._send = mute  # type: ignore[method-assign]
    await b.start()
    await until(lambda: b.owned() == set(range(PARTITIONS)), "b takes all too", a, b)
    assert a.owned() == set(range(PARTITIONS))  # both hold every partition
    window = events(600, 30)
    calls.clear()
    await append_to_store(store, window)
    await until(lambda: len({eid for _, eid in calls}) >= 600, "the window applied", a, b)
    await asyncio.sleep(1.0)  # anything doubly applied would show by now
    appliers: dict[str, set[str]] = {}
    for who, eid in calls:
        appliers.setdefault(eid, set()).add(who)
    assert all(who == {"a"} for who in appliers.values()), appliers  # SAC: a only
    assert len(calls) == 600  # and once each

    group._heard, group._send = heard, send  # type: ignore[method-assign]
    await until(
        lambda: len(a.owned()) == PARTITIONS // 2 and len(b.owned()) == PARTITIONS // 2,
        "the members agree again",
        a,
        b,
    )
    after = events(300, 30, 600)
    await append_to_store(store, after)
    expected = expected_counts(window + after)
    await until(
        lambda: all((a.value(k) or b.value(k)) == v for k, v in expected.items()),
        "exact after the disagreement",
        a,
        b,
    )


@pytest.mark.acceptance  # make acceptance: too heavy for make test on two cores
async def test_a_member_nobody_hears_hands_over_without_losing_an_event(group: Group) -> None:
    """A's heartbeats are lost and it hears B late: B takes every partition and replays
    the store while A, the active consumer, goes on applying; then A sees B holding them
    and lets go (its contests are lost too). What A applied after B's replay reached the
    store's head is replayed by B before its first live message."""
    a, b, calls, store = group.a, group.b, group.calls, group.store
    await a.start()
    await until(lambda: a.owned() == set(range(PARTITIONS)), "a owns all", a, b)
    group = a.group
    send, heard = group._send, group._heard

    async def mute(*, leaving: bool = False) -> None:
        return None

    group._send = mute  # type: ignore[method-assign]
    group._heard = lambda *args: None  # type: ignore[method-assign]
    stream = events(4000, 60)

    async def load() -> None:
        for i in range(0, len(stream), 50):
            await append_to_store(store, stream[i : i + 50])
            await asyncio.sleep(0.1)

    loading = asyncio.create_task(load())
    await asyncio.sleep(0.5)
    await b.start()  # mid-load
    await until(lambda: b.owned() == set(range(PARTITIONS)), "b takes all", a, b)
    await asyncio.sleep(1.5)  # b caught up and waits; a, the active consumer, applies
    assert not loading.done()
    applied_by_a = len([1 for who, _ in calls if who == "a"])
    await until(  # the scenario: a applies live events after b's replay reached the head
        lambda: len([1 for who, _ in calls if who == "a"]) > applied_by_a,
        "a applies meanwhile",
        a,
        b,
    )
    group._heard = heard  # type: ignore[method-assign]  # a hears b holding everything
    await until(lambda: not a.owned(), "a lets go", a, b)
    await loading
    expected = expected_counts(stream)
    await until(lambda: all(b.value(k) == v for k, v in expected.items()), "b exact", a, b)
    assert {who for who, _ in calls} == {"a", "b"}  # both applied live events

    group._send = send  # type: ignore[method-assign]
    await until(
        lambda: len(a.owned()) == PARTITIONS // 2 and len(b.owned()) == PARTITIONS // 2,
        "a is heard again and takes its share",
        a,
        b,
    )
    more = events(200, 60, 4000)
    await append_to_store(store, more)
    expected = expected_counts(stream + more)
    await until(
        lambda: all((a.value(k) or b.value(k)) == v for k, v in expected.items()),
        "exact once the members agree",
        a,
        b,
    )


# --- the reference app, as processes --------------------------------------------------------


async def _append_slowly(store: str, evs: list[Event], chunk: int, pause_s: float) -> None:
    for i in range(0, len(evs), chunk):
        await append_to_store(store, evs[i : i + chunk])
        await asyncio.sleep(pause_s)


async def _forwarded(store: str, name: str) -> int:
    """The forwarder's next store position (its checkpoint, in the store's database)."""
    from streamapp.eventstore import open_store

    es = await open_store(store)
    try:
        return await es.forwarder_state(name).load()
    finally:
        await es.close()


async def _drained(amqp: str, ns: str, store: str, total: int, stalled_s: float = 60) -> None:
    """Until the forwarder published all ``total`` events and the queues are empty; fails
    once the forwarder's checkpoint, then the queues' depth, stood still for ``stalled_s``."""
    at = [0]

    async def published() -> bool:
        at[0] = await _forwarded(store, f"{ns}orders")
        return at[0] > total

    await until_progress(
        published,
        what=f"the forwarder past position {total}",
        progress=lambda: at[0],
        stalled_s=stalled_s,
        poll_s=1.0,
    )
    ready = [-1]

    async def drained() -> bool:
        ready[0] = sum([await depth(amqp, f"{ns}orders.{p}") for p in range(8)])
        return ready[0] == 0

    await until_progress(
        drained, what="the queues drained", progress=lambda: ready[0], stalled_s=stalled_s
    )


async def _read_exact(workers: list[WorkerProc], expected: dict[str, tuple[int, str]]) -> None:
    # asked twice (local and forwarded) while events still arrive, a key may move
    await wait_exact(workers, expected)


@pytest.mark.acceptance  # make acceptance: ~4 min on a loaded 2-core box, too heavy for make test
async def test_orders_100k_via_forwarder_while_workers_go_2_3_1_with_3_sigkills(
    amqp: str, tmp_path: Path
) -> None:
    ns = f"rg{uuid.uuid4().hex[:6]}-"
    store = f"sqlite:///{tmp_path / 'events.db'}"
    env = rabbit_env(
        amqp,
        STREAMAPP_EVENT_STORE=store,
        STREAMAPP_POLL_TIMEOUT_MS="200",
        STREAMAPP_AMQP_HEARTBEAT_MS="300",
        STREAMAPP_AMQP_SESSION_TIMEOUT_MS="2000",
    )
    topics_create(ns, env)
    evs, expected = order_events(1000, 100_000)

    def worker(name: str) -> WorkerProc:
        return WorkerProc(
            "127.0.0.1:1", ns, tmp_path / name, tmp_path / f"{name}.log", extra_env=dict(env)
        )

    forwarder = StreamappProc(
        ("forward", "-A", "agents.orders:app", "--chunk", "1000"),
        "127.0.0.1:1",
        ns,
        tmp_path / "fwd.log",
        extra_env=env,
    ).start()
    w1, w2, w3 = worker("w1").start(), worker("w2").start(), worker("w3")
    procs = [w1, w2, w3]
    try:
        await wait_ready(w1)
        await wait_ready(w2)
        appending = asyncio.create_task(_append_slowly(store, evs, 2000, 0.25))

        async def kill(w: WorkerProc) -> None:
            forwarded = await _forwarded(store, f"{ns}orders")
            assert forwarded <= len(evs), "the load ended before the kill"
            w.kill()

        await asyncio.sleep(2)
        await kill(w1)  # SIGKILL 1, and back with its (now stale) state
        w1.start()
        await asyncio.sleep(2)
        w3.start()  # 2 -> 3
        await asyncio.sleep(3)
        await kill(w2)  # SIGKILL 2, and back
        w2.start()
        await asyncio.sleep(3)
        await kill(w3)  # SIGKILL 3: 3 -> 2
        await wait_ready(w2, 90)  # restarted and in the group
        assert w2.stop() == 0  # 2 -> 1, a clean leave
        await appending
        await _drained(amqp, ns, store, len(evs))
        status = await wait_ready(w1, 90)
        assert len(status["partitions"]) == 8  # the last worker owns every partition
        await _read_exact([w1], expected)
        assert w1.stop() == 0
        assert sum([await depth(amqp, f"{ns}orders.{p}") for p in range(8)]) == 0
        for w in procs:
            assert "Traceback" not in w.log_text(), around_traceback(w.log_text())
    finally:
        forwarder.kill()
        for w in procs:
            if w.alive:
                w.kill()


@pytest.mark.serial  # restarts the shared RabbitMQ: run alone
@pytest.mark.acceptance  # make acceptance; make test keeps the connection losses through a proxy
async def test_orders_exact_through_a_rabbitmq_restart(services: Services, tmp_path: Path) -> None:
    amqp = services.amqp
    ns = f"rr{uuid.uuid4().hex[:6]}-"
    store = f"sqlite:///{tmp_path / 'events.db'}"
    env = rabbit_env(amqp, STREAMAPP_EVENT_STORE=store, STREAMAPP_POLL_TIMEOUT_MS="200")
    topics_create(ns, env)
    evs, expected = order_events(300, 20_000)
    forwarder = StreamappProc(
        ("forward", "-A", "agents.orders:app", "--chunk", "500"),
        "127.0.0.1:1",
        ns,
        tmp_path / "fwd.log",
        extra_env=env,
    ).start()
    workers = [
        WorkerProc(
            "127.0.0.1:1", ns, tmp_path / n, tmp_path / f"{n}.log", extra_env=dict(env)
        ).start()
        for n in ("w1", "w2")
    ]
    try:
        for w in workers:
            await wait_ready(w)
        appending = asyncio.create_task(_append_slowly(store, evs, 500, 0.25))
        # mid-stream, observed: both workers have applied some, and more is to come
        await wait_statuses(
            workers, lambda ss: all(processed(s) > 0 for s in ss), "both workers applying", 90
        )
        assert not appending.done(), "the load ended before the restart"
        try:
            restart(services, "down", "rabbitmq")  # mid-stream
            await asyncio.sleep(3)
            assert all(w.alive for w in workers)  # they wait for the broker
            assert forwarder.alive
        finally:
            restart(services, "up", "rabbitmq")
        await appending
        await _drained(amqp, ns, store, len(evs))
        for w in workers:
            await wait_ready(w, 90)
        await _read_exact(workers, expected)
        for w in workers:
            assert w.stop() == 0
    finally:
        forwarder.kill()
        for w in workers:
            if w.alive:
                w.kill()


@pytest.mark.acceptance  # make acceptance: too heavy for make test on two cores
async def test_views_of_three_rabbitmq_workers_answer_every_key_from_its_owner(
    amqp: str, tmp_path: Path
) -> None:
    """3 workers, 8 partitions, 1,000 keys: each worker serves its partitions and
    forwards the others' keys to their owner, whose address it learned from the members'
    heartbeats; every key asked of every worker gets the owner's value."""
    ns = f"rv{uuid.uuid4().hex[:6]}-"
    store = f"sqlite:///{tmp_path / 'events.db'}"
    env = rabbit_env(amqp, STREAMAPP_EVENT_STORE=store, STREAMAPP_POLL_TIMEOUT_MS="200")
    topics_create(ns, env)
    evs, expected = order_events(1000, 5000)
    await append_to_store(store, evs)
    forwarder = StreamappProc(
        ("forward", "-A", "agents.orders:app"),
        "127.0.0.1:1",
        ns,
        tmp_path / "fwd.log",
        extra_env=env,
    ).start()
    workers = [
        WorkerProc(
            "127.0.0.1:1", ns, tmp_path / n, tmp_path / f"{n}.log", extra_env=dict(env)
        ).start()
        for n in ("w1", "w2", "w3")
    ]
    try:
        await wait_group_ready(workers, 8)
        await _drained(amqp, ns, store, len(evs))
        await _read_exact(workers, expected)  # one local answer per key, the other forwarded
        statuses = [await w.status() for w in workers]
        assert sorted(len(s["partitions"]) for s in statuses if s) == [2, 3, 3], statuses
        for w in workers:
            assert w.stop() == 0
    finally:
        forwarder.kill()
        for w in workers:
            if w.alive:
                w.kill()
