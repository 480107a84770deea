"""The table-versions world: the orders history, a live load, a reader, deploy drivers.

Shared by ``test_table_versions_kafka.py``, ``_rabbitmq.py`` and ``_embedded.py``. The
app is :mod:`tests.apps.versions_app` (``VERSIONS_VARIANT`` selects the code a worker
runs), the truth is :class:`tests.support.versions_model.FoldModel` (fed with every
event before it is appended). Every key exists in the store before a worker starts, so a
404 for an unpinned key is always wrong.

The :class:`Reader` asks every key of every worker, round after round, with ``?meta=1``
(and a pinned ``?version=1`` of each key of one worker per round), and records every
answer that breaks the rules of issue 17 in :attr:`Reader.violations`:

- a 200 carries ``Streamapp-Table-Version``; its value is the exact fold of that version
  at a stream version between what the reader had seen of the key before asking and
  the key's head once the answer came (monotonic per key and version across workers,
  and per key and worker across the versions it serves unpinned: a worker switched to
  v2 before another, and v2 on RabbitMQ replayed the store past what the queue
  delivered to v1 meanwhile, so v1 on one worker may stand below v2 on another);
  ``?meta=1`` says the same version;
- a 503 carries ``Retry-After`` (and the version header); anything else (404 for a key
  that exists, 421, 500) is a violation;
- no v2 answer before the driver allowed it (:meth:`Reader.allow`: the last worker of
  the old code is gone), and no unpinned v1 answer from a worker once it answered v2
  (asked after that answer came).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp
import orjson

from streamapp import Event
from tests.apps.versions_app import PARTITIONS, TABLE
from tests.support.versions_model import FoldModel
from tests.support.waits import frozen, run_watched, until

from .harness import (
    ROOT,
    StreamappProc,
    WorkerProc,
    app_env,
    around_traceback,
    streamapp_cmd,
    wait_group_ready,
    wait_ready,
)

APP = "tests.apps.versions_app:app"
VARIANT = "VERSIONS_VARIANT"
LATER = ("order.item_added", "order.item_added", "order.paid", "order.shipped", "order.cancelled")
VERSION_HEADER = "Streamapp-Table-Version"


def event(rng: random.Random, key: str, first: bool) -> Event:
    """One order event of ``key``: ``order.placed`` first, then the later kinds."""
    kind = "order.placed" if first else rng.choice(LATER)
    data = {"qty": rng.randint(1, 5), "price": rng.randint(1, 100)} if "item" in kind or (
        kind == "order.placed"
    ) else {}  # fmt: skip
    return Event.create(kind, stream_id=key, source="tests", data=data)


def history(n_keys: int, n_events: int, seed: int = 17) -> list[Event]:
    """``n_events`` events over ``n_keys`` orders, each order placed first."""
    rng = random.Random(seed)
    keys = [f"order-{i:05d}" for i in range(n_keys)]
    out = [event(rng, k, True) for k in keys]
    out += [event(rng, rng.choice(keys), False) for _ in range(n_events - n_keys)]
    return out


async def append(url: str, model: FoldModel, events: Sequence[Event], chunk: int = 5000) -> None:
    """Append ``events`` to the store at ``url`` in batches (the model first)."""
    from streamapp.eventstore import Append, open_store

    store = await open_store(url)
    try:
        for i in range(0, len(events), chunk):
            batch = events[i : i + chunk]
            model.add(batch)
            result = await store.append_many([Append(e.stream_id or "", [e]) for e in batch])
            assert result.error is None, result.error
    finally:
        await store.close()


@dataclass
class Load:
    """Appends to the store at ``rate`` events/s over the model's keys until stopped."""

    url: str
    model: FoldModel
    rate: float = 1000.0
    seed: int = 29
    appended: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> Load:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> int:
        self._stop.set()
        if self._task is not None:
            await self._task
        return self.appended

    async def close(self) -> None:
        """Stop it, never by cancelling: a cancelled append leaves its thread writing on
        the SQLite connection that the store's close then closes (a segfault)."""
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task

    async def _run(self) -> None:
        from streamapp.eventstore import Append, open_store

        rng = random.Random(self.seed)
        keys = self.model.streams()
        store = await open_store(self.url)
        tick = 0.1
        started = time.monotonic()
        try:
            while not self._stop.is_set():
                due = int((time.monotonic() - started) * self.rate) - self.appended
                if due > 0:
                    batch = [event(rng, rng.choice(keys), False) for _ in range(due)]
                    self.model.add(batch)
                    result = await store.append_many(
                        [Append(e.stream_id or "", [e]) for e in batch]
                    )
                    assert result.error is None, result.error
                    self.appended += len(batch)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), tick)
        finally:
            await store.close()


async def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


ROUND_PAUSE_S = 0.3
"""The reader's pause between two rounds of every key of every worker."""


@dataclass
class Reader:
    """Asks every key of every worker until stopped; see the module's docstring."""

    model: FoldModel
    workers: list[WorkerProc]
    concurrency: int = 16
    max_rounds: int = 10_000
    v2_allowed: bool = False
    pinned: str = "exact"
    """What ``?version=1`` must answer: ``exact`` (the v1 fold), ``off`` (not asked) or
    ``gone`` (404: v1 was retired)."""
    seen: dict[tuple[str, int], int] = field(default_factory=dict)
    """(key, table version) -> the highest stream version answered, by any worker."""
    seen_at: dict[tuple[str, int], int] = field(default_factory=dict)
    """(key, worker) -> the highest stream version that worker answered unpinned."""
    seen_by: dict[tuple[str, int], tuple[Any, ...]] = field(default_factory=dict)
    """(key, version) -> the answer that gave :attr:`seen` (worker, phase, store position)."""
    switched_at: dict[int, float] = field(default_factory=dict)
    """Worker index -> when its first v2 answer came (monotonic)."""
    counts: Counter[tuple[int, int, int | None]] = field(default_factory=Counter)
    """(worker, HTTP status, table version) -> answers."""
    unreachable: Counter[int] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    rounds: int = 0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> Reader:
        self._task = asyncio.create_task(self._run())
        return self

    def allow(self) -> None:
        """From now on a v2 answer is allowed (no worker of the old code is left)."""
        self.v2_allowed = True

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def close(self) -> None:
        """Cancel it (a test that failed midway leaves no task behind)."""
        await _cancel(self._task)

    def check(self) -> None:
        assert self._task is None or not self._task.done() or self._task.exception() is None
        kinds = Counter(v.split(": ", 1)[-1].split(":")[0] for v in self.violations)
        assert not self.violations, (
            f"{len(self.violations)} wrong answers {dict(kinds)}, e.g. {self.violations[:8]}; "
            f"answers {dict(self.counts)}"
        )

    async def checked(self) -> None:
        """:meth:`check`; when it fails, with what each worker's ``GET /tables`` and the
        lanes of ``/status`` said just then (what a failure report needs)."""
        if not self.violations:
            return
        seen = []
        for i, w in enumerate(self.workers):
            status = await w.status()
            lanes = {
                p: {a: (lane.get("phase"), lane.get("store_position")) for a, lane in e.get(
                    "agents", {}).items()}
                for p, e in (status or {}).get("partitions", {}).items()
            }  # fmt: skip
            seen.append((i, version_state(await tables_of(w), 2), lanes))
        try:
            self.check()
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nworkers then (v2's entry, lanes): {seen}") from None

    def answered(self, worker: int, status: int, version: int | None) -> int:
        return self.counts[(worker, status, version)]

    def asked(self) -> int:
        """Requests that came back so far (answers, and failures to reach a worker)."""
        return sum(self.counts.values()) + sum(self.unreachable.values())

    def done(self) -> bool:
        """Whether its task ended (raises the task's exception, if any)."""
        if self._task is None or not self._task.done():
            return False
        self._task.result()
        return True

    async def _run(self) -> None:
        sem = asyncio.Semaphore(self.concurrency)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
            while not self._stop.is_set() and self.rounds < self.max_rounds:
                keys = self.model.streams()
                pinned_worker = self.rounds % len(self.workers)

                async def one(key: str, pinned_worker: int = pinned_worker) -> None:
                    async with sem:
                        for i in range(len(self.workers)):
                            await self._ask(http, i, key)
                        if self.pinned != "off":
                            await self._ask(http, pinned_worker, key, pin=1)

                await asyncio.gather(*(one(k) for k in keys))
                self.rounds += 1
                # a breath between rounds: every key is still asked of every worker every
                # second or two, and the machine keeps a core for the workers under test
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), ROUND_PAUSE_S)

    async def _ask(
        self, http: aiohttp.ClientSession, i: int, key: str, pin: int | None = None
    ) -> None:
        w = self.workers[i]
        query = "?meta=1" + ("" if pin is None else f"&version={pin}")
        floors = {v: self.seen.get((key, v), 0) for v in (1, 2)}
        own = self.seen_at.get((key, i), 0) if pin is None else 0  # what it serves unpinned
        asked = time.monotonic()
        try:
            async with http.get(f"http://127.0.0.1:{w.port}/tables/{TABLE}/{key}{query}") as r:
                status, headers, body = r.status, r.headers, await r.read()
        except (aiohttp.ClientError, TimeoutError):
            self.unreachable[i] += 1  # a worker that is down or restarting
            return
        head = self.model.head(key)
        raw = headers.get(VERSION_HEADER)
        version = int(raw) if raw is not None and raw.isdigit() else None
        self.counts[(i, status, version)] += 1
        at = datetime.now().strftime("%H:%M:%S.%f")[:-3]  # to read beside the workers' logs
        where = f"{at} worker {i} (port {w.port}) {key}{query} v{version}"
        if status == 503:
            if not headers.get("Retry-After"):
                self.violations.append(f"{where}: 503 without Retry-After")
            if version is None:
                self.violations.append(f"{where}: 503 without {VERSION_HEADER}")
            return
        if pin is not None and self.pinned == "gone":
            if status != 404:
                self.violations.append(f"{where}: {status} for a retired version, not 404")
            return
        if status != 200:
            self.violations.append(f"{where}: {status} {body[:300]!r}")
            return
        meta = orjson.loads(body)
        if version is None:
            self.violations.append(f"{where}: 200 without {VERSION_HEADER}")
            return
        if meta.get("version") != version:
            self.violations.append(f"{where}: meta version {meta.get('version')} != {version}")
        if pin is not None and version != pin:
            self.violations.append(f"{where}: pinned v{pin}, answered v{version}")
        if pin is None and version == 2 and not self.v2_allowed:
            self.violations.append(f"{where}: v2 answered while a worker of the old code ran")
        if pin is None and version == 1 and asked > self.switched_at.get(i, asked + 1):
            self.violations.append(f"{where}: v1 answered after this worker answered v2")
        seen = max(floors.get(version, 0), own)
        why = self.model.check(version, key, meta.get("value"), seen, head)
        if why is not None:
            said = {k: meta.get(k) for k in ("partition", "phase", "checkpoint", "store_position")}
            by = self.seen_by.get((key, version))
            self.violations.append(f"{where}: {why} (served {said}; seen from {by}, own {own})")
            return
        n = meta["value"]["n"]
        if meta.get("stream_version", n) != n:  # the key's committed stream version
            self.violations.append(f"{where}: stream_version {meta['stream_version']} != n {n}")
        if n > self.seen.get((key, version), 0):
            self.seen[(key, version)] = n
            self.seen_by[(key, version)] = (i, meta.get("phase"), meta.get("store_position"))
        if pin is None:
            self.seen_at[(key, i)] = max(self.seen_at.get((key, i), 0), n)
        if pin is None and version == 2:
            self.switched_at.setdefault(i, time.monotonic())


async def tables_of(w: WorkerProc) -> dict[str, Any] | None:
    """The worker's ``GET /tables`` (None while it does not answer)."""
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(
                f"http://127.0.0.1:{w.port}/tables", timeout=aiohttp.ClientTimeout(total=5)
            ) as r,
        ):
            body: dict[str, Any] = await r.json()
            return body if r.status == 200 else None
    except (TimeoutError, aiohttp.ClientError):
        return None


def version_state(tables: dict[str, Any] | None, version: int) -> dict[str, Any] | None:
    """The entry of ``order_status`` vN in a ``GET /tables`` answer."""
    for table in (tables or {}).get("tables", []):
        if table.get("name") == TABLE:
            for v in table.get("versions", []):
                if v.get("version") == version:
                    entry: dict[str, Any] = v
                    return entry
    return None


async def wait_state(
    workers: list[WorkerProc],
    version: int,
    states: set[str],
    stalled_s: float = 180.0,
    reader: Reader | None = None,
) -> WorkerProc:
    """Until some worker's ``GET /tables`` shows order_status vN in one of ``states``
    (failing early when ``reader`` saw a wrong answer meanwhile); fails once no worker's
    entry for vN (state, live partitions, build progress) changed for ``stalled_s``."""
    last: list[Any] = []

    async def check() -> WorkerProc | None:
        if reader is not None:
            await reader.checked()
        last[:] = []
        for w in workers:
            assert w.alive, f"worker died:\n{w.log_text()[-3000:]}"
            entry = version_state(await tables_of(w), version)
            last.append(entry)
            if entry is not None and entry.get("state") in states:
                return w
        return None

    found: WorkerProc = await until(
        check,
        what=f"order_status v{version} {sorted(states)} on a worker",
        progress=lambda: frozen([_without_head(e) for e in last]),
        stalled_s=stalled_s,
        poll_s=0.2,
        detail=lambda: last,
    )
    return found


def _without_head(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    """A version's entry without the store's head (it moves with the live load alone)."""
    if entry is None or not isinstance(entry.get("progress"), dict):
        return entry
    return {**entry, "progress": {k: v for k, v in entry["progress"].items() if k != "head"}}


async def roll(
    workers: list[WorkerProc],
    variant: str,
    reader: Reader | None = None,
    *,
    ready_s: float = 120.0,
    started: Any = None,
) -> None:
    """A rolling deploy: each worker in turn stopped (SIGTERM), started with ``variant``
    and waited for (ready). ``reader.allow()`` is called as the last worker of the old
    code stops; ``started(i)`` (a coroutine function) runs once worker i is started,
    before it is ready (it catches up meanwhile). ``ready_s``: how long a worker's /status
    may stand still before it is ready."""
    for i, w in enumerate(workers):
        if reader is not None and i == len(workers) - 1:
            reader.allow()
        assert w.stop() == 0, w.log_text()[-3000:]
        w.extra_env[VARIANT] = variant
        w.start()
        if started is not None:
            await started(i)
        await wait_ready(w, ready_s)


def retire(w: WorkerProc, version: int, *, yes: bool = True) -> subprocess.CompletedProcess[str]:
    """``streamapp retire -A APP order_status --version N [--yes]`` with ``w``'s env."""
    args = ["retire", "-A", APP, TABLE, "--version", str(version)] + (["--yes"] if yes else [])
    return run_watched(
        streamapp_cmd(*args),
        env=app_env(w.bootstrap, w.namespace, **{**w.extra_env, "STREAMAPP_WEB_PORT": str(w.port)}),
        cwd=ROOT,
    )


async def converged(
    reader: Reader, version: int, *, pin: bool = False, stalled_s: float = 180.0
) -> None:
    """Until every key of every worker answers vN (``pin``: asked ``?version=N``) at the
    key's head (the load has stopped). Waits while the answers advance (the forwarder
    and the workers work off their lag); fails once they stood still for ``stalled_s``."""
    query = "?meta=1" + (f"&version={version}" if pin else "")
    behind: list[Any] = []
    applied = [0]  # the stream versions answered, summed: what the workers worked off
    async with aiohttp.ClientSession() as http:

        async def check() -> bool:
            behind[:], applied[0] = [], 0
            for key in reader.model.streams():
                head = reader.model.head(key)
                for i, w in enumerate(reader.workers):
                    url = f"http://127.0.0.1:{w.port}/tables/{TABLE}/{key}{query}"
                    async with http.get(url) as r:
                        raw = r.headers.get(VERSION_HEADER)
                        body = await r.json() if r.status == 200 else None
                    value = None if body is None else body.get("value")
                    applied[0] += value.get("n", 0) if isinstance(value, dict) else 0
                    if raw != str(version) or value != reader.model.value(version, key, head):
                        behind.append((i, key, r.status, raw, value, head))
            return not behind

        await until(
            check,
            what=f"every answer v{version} at the key's head",
            progress=lambda: applied[0],
            stalled_s=stalled_s,
            poll_s=1.0,
            detail=lambda: f"{len(behind)} answers behind, e.g. {behind[:5]}",
        )


def topics_create(w: WorkerProc, variant: str) -> str:
    """``streamapp topics create`` of the app as ``variant`` declares it (v2: its
    changelog topic), with ``w``'s environment (broker, namespace)."""
    run = run_watched(
        streamapp_cmd("topics", "create", "-A", APP),
        env=app_env(w.bootstrap, w.namespace, **{**w.extra_env, VARIANT: variant}),
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


async def wait_lane(
    w: WorkerProc, agent: str, phase: str, stalled_s: float = 120.0, poll_s: float = 0.05
) -> None:
    """Until some lane of ``agent`` on ``w`` is in ``phase``; fails once those lanes (their
    phases and positions, none while the worker starts) stood still for ``stalled_s``."""
    seen: list[Any] = []

    async def check() -> bool:
        assert w.alive, f"worker died:\n{w.log_text()[-3000:]}"
        seen[:] = await lanes_of(w, agent)
        return any(lane.get("phase") == phase for lane in seen)

    await until(
        check,
        what=f"a {agent} lane {phase} on port {w.port}",
        progress=lambda: frozen(seen),
        stalled_s=stalled_s,
        poll_s=poll_s,
        detail=lambda: seen,
    )


async def lanes_of(w: WorkerProc, agent: str) -> list[dict[str, Any]]:
    """The status of ``agent``'s lane in each partition ``w`` owns (its /status)."""
    status = await w.status()
    if status is None:
        return []
    return [
        lane
        for p in status["partitions"].values()
        for name, lane in (p.get("agents") or {}).items()
        if name == agent
    ]


async def wait_switched(reader: Reader, stalled_s: float = 180.0) -> None:
    """Until every worker has answered v2 to the reader; fails once neither the workers
    switched nor any worker's entry for v2 (state, live partitions, build progress)
    changed for ``stalled_s``."""
    entries: list[Any] = []

    async def check() -> bool:
        await reader.checked()
        if len(reader.switched_at) == len(reader.workers):
            return True
        entries[:] = [_without_head(version_state(await tables_of(w), 2)) for w in reader.workers]
        return False

    await until(
        check,
        what=f"every worker switched to v2 (workers {sorted(reader.switched_at)} did)",
        progress=lambda: (tuple(sorted(reader.switched_at)), frozen(entries)),
        stalled_s=stalled_s,
        poll_s=0.5,
        detail=lambda: f"answers {dict(reader.counts)}; v2 entries {entries}",
    )


async def wait_rounds(reader: Reader, more: int = 1, stalled_s: float = 120.0) -> None:
    """Until the reader has done ``more`` whole rounds from now; fails once it got no
    answer (nor an unreachable worker) for ``stalled_s``."""
    target = reader.rounds + more

    async def check() -> bool:
        await reader.checked()
        if reader.done():
            raise AssertionError(f"the reader stopped at round {reader.rounds}")
        return reader.rounds >= target

    await until(
        check,
        what=f"reader at round {target}",
        progress=lambda: (reader.rounds, reader.asked()),
        stalled_s=stalled_s,
        poll_s=0.2,
        detail=lambda: f"at round {reader.rounds}; answers {dict(reader.counts)}",
    )


@dataclass
class Deployment:
    """The workers (and the forwarder, but in embedded mode) of one namespace and store."""

    workers: list[WorkerProc]
    url: str
    forwarder: StreamappProc | None = None
    topics: bool = True
    """Whether the broker has topics to create (``streamapp topics create``)."""

    def kill_all(self) -> None:
        if self.forwarder is not None:
            self.forwarder.kill()
        for w in self.workers:
            if w.alive:
                w.kill()


async def deploy_v2_and_retire_v1(
    d: Deployment, n_keys: int, n_events: int, *, rate: float = 1000.0, kills: bool = False
) -> Reader:
    """Issue 17's scenario: v1 alone, exact; a rolling deploy of v1+v2 (``kills``: a
    SIGKILL of the first new-code worker while its v2 lanes catch up, and of another at
    the switch); the switch on every worker; v2 and pinned v1 exact at the head; retire
    refused for v2 (active) and v1 (declared); a roll to v2 alone; v1 retired; pinned v1
    404 while v2 stays exact. The reader runs throughout; it is returned, checked."""
    workers = d.workers
    if d.topics:
        topics_create(workers[0], "v1")
    model = FoldModel()
    await append(d.url, model, history(n_keys, n_events))
    for w in workers:
        w.start()
    if d.forwarder is not None:
        d.forwarder.start()
    await wait_group_ready(workers, PARTITIONS)
    load = Load(d.url, model, rate=rate).start()
    reader = Reader(model, workers).start()
    try:
        await _scenario(d, load, reader, rate, kills)
    finally:
        await reader.close()
        await load.close()
    return reader


async def _scenario(d: Deployment, load: Load, reader: Reader, rate: float, kills: bool) -> None:
    workers = d.workers
    await wait_rounds(reader)  # v1 alone, exact, on every worker
    assert not reader.switched_at
    if d.topics:
        topics_create(workers[0], "v1+v2")  # v2's changelog topic, as an operator would

    async def started(i: int) -> None:
        if kills and i == 0:  # kill -9 the first new-code worker while its v2 lanes build
            await wait_lane(workers[0], "status_v2", "catching_up", poll_s=0.02)
            workers[0].kill()
            workers[0].start()

    await roll(workers, "v1+v2", reader, started=started)
    await wait_state(workers, 2, {"active"}, reader=reader)
    if kills:  # kill -9 a worker at the switch (the last one when there is one)
        victim = workers[min(1, len(workers) - 1)]
        victim.kill()
        victim.start()
    await wait_group_ready(workers, PARTITIONS)
    await wait_switched(reader)
    await wait_rounds(reader)
    appended = await load.stop()
    assert appended > rate, "the live load did not run"
    await converged(reader, 2)  # every key of every worker: v2, exact, at the head
    await converged(reader, 1, pin=True)  # and v1 pinned, exact too
    for version in (2, 1):  # retire refuses the active version, and one still declared
        refused = retire(workers[0], version)
        assert refused.returncode != 0, (version, refused.stdout, refused.stderr)
    reader.pinned = "off"
    await roll(workers, "v2", reader)  # v1 out of the code, not retired yet
    done = retire(workers[0], 1)
    assert done.returncode == 0, (done.stdout, done.stderr)
    reader.pinned = "gone"
    await wait_rounds(reader)  # ?version=1: 404 on every key now, v2 still exact
    await reader.stop()
    reader.check()
    for i in range(len(workers)):  # every worker answered v1, then v2
        assert reader.answered(i, 200, 1) > 0, reader.counts
        assert reader.answered(i, 200, 2) > 0, reader.counts

    def left() -> tuple[str, ...]:  # each worker drops v1's stores once it hears (it polls)
        return tuple(str(p) for w in workers for p in w.data_dir.glob("**/status_v1"))

    await until(lambda: not left(), what="v1's stores dropped", progress=left, stalled_s=60)
    for w in workers:
        assert "Traceback" not in w.log_text(), around_traceback(w.log_text())
