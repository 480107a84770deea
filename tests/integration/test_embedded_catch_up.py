"""Embedded mode (``STREAMAPP_BROKER=none``): catch-up before live, and the one store
reader serving every partition and lane on its own.

Worker processes of :mod:`tests.apps.gate_app` on a SQLite store, whose handler holds an
event of type ``gate`` until the test opens the gate: a lane is then inside its handler
for as long as the test looks. Every wait ends on observed state, and fails when the
worker stops moving (its applied counts, its phases) for :data:`QUIET_S`.

- An agent with tables and no ``history=`` catches up before it is ready: ``/readyz``
  answers 503 and its views 503 (not 404, not a value half replayed) while it replays.
- Its new table version builds beside the live one, and is not active until built.
- While a version builds, the live version takes new events (the build holds its own
  partition's lane only).
- Partitions catch up and follow the store concurrently: one held in a handler does
  not hold the others.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamapp import Event
from streamapp.topics import partition_for

from .harness import WorkerProc, append_to_store, read_table

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.gate_app:app"
PARTITIONS = 4
HELD = 0
"""The partition of the gate's stream."""
QUIET_S = 60.0
"""A wait fails once the worker showed no progress for this long."""
HEADER = "Streamapp-Table-Version"


def _keys(partition: int, n: int, prefix: str = "acct") -> list[str]:
    """``n`` stream ids of ``partition``."""
    out, i = [], 0
    while len(out) < n:
        key = f"{prefix}-{i}"
        if partition_for(key.encode(), PARTITIONS) == partition:
            out.append(key)
        i += 1
    return out


class World:
    """A store of a few events per stream on every partition, with a ``gate`` event on
    partition :data:`HELD` after most of them; workers of the gate app on it."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.url = tmp, f"sqlite:///{tmp / 'events.db'}"
        self.ns = f"ecu{uuid.uuid4().hex[:6]}-"
        self.gate_dir = tmp / "gate"
        self.gate_dir.mkdir()
        self.keys = {p: _keys(p, 6) for p in range(PARTITIONS)}
        self.gate_key = _keys(HELD, 1, prefix="gate")[0]
        self.counts: dict[str, int] = {}
        self.workers: list[WorkerProc] = []

    async def fill(self) -> None:
        """Three events per key; the gate; one more event per key of the held partition
        (they wait behind the gate)."""
        events = [
            Event.create("deposit", stream_id=k, data={"n": r})
            for r in range(3)
            for p in range(PARTITIONS)
            for k in self.keys[p]
        ]
        events.append(Event.create("gate", stream_id=self.gate_key, data={}))
        events += [Event.create("deposit", stream_id=k, data={}) for k in self.keys[HELD]]
        await self.append(events)

    async def append(self, events: list[Event]) -> None:
        await append_to_store(self.url, events)
        for e in events:
            assert e.stream_id is not None
            self.counts[e.stream_id] = self.counts.get(e.stream_id, 0) + 1

    def worker(self, versions: str, held: str, log: str) -> WorkerProc:
        env = {
            "STREAMAPP_BROKER": "none",
            "STREAMAPP_EVENT_STORE": self.url,
            "STREAMAPP_POLL_TIMEOUT_MS": "100",
            "GATE_VERSIONS": versions,
            "GATE_HELD": held,
            "GATE_DIR": str(self.gate_dir),
        }
        w = WorkerProc(
            "127.0.0.1:1", self.ns, self.tmp / "data", self.tmp / log, APP, extra_env=env
        )
        self.workers.append(w.start())
        return w

    async def arrived(self, version: int) -> bool:
        """Version ``version``'s handler is held at the gate."""
        return (self.gate_dir / f"reached-{version}").exists()

    @property
    def opened(self) -> bool:
        return (self.gate_dir / "open").exists()

    def open_gate(self) -> None:
        (self.gate_dir / "open").touch()

    def kill_all(self) -> None:
        self.open_gate()
        for w in self.workers:
            if w.alive:
                w.kill()


async def _get(w: WorkerProc, path: str) -> tuple[int, Any, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{w.port}{path}", timeout=aiohttp.ClientTimeout(total=5)) as r,
    ):
        return r.status, await r.json(), dict(r.headers)


async def _moves(w: WorkerProc) -> object:
    """What changes while the worker makes progress: its counts and phases."""
    status = await w.status()
    if status is None:
        return None
    parts = status["partitions"].values()
    return sorted((p["replayed"], p["processed"], p["phase"], str(p.get("agents"))) for p in parts)


async def _until(
    w: WorkerProc, check: Callable[[], Awaitable[bool]], what: str, quiet_s: float = QUIET_S
) -> None:
    """Until ``check()`` holds; fails when the worker died or showed no progress for
    ``quiet_s`` (its counts and phases unchanged)."""
    seen, still_since = await _moves(w), time.monotonic()
    while not await check():
        assert w.alive, f"worker died waiting for {what}:\n{w.log_text()[-3000:]}"
        now = await _moves(w)
        if now != seen:
            seen, still_since = now, time.monotonic()
        assert time.monotonic() - still_since < quiet_s, (
            f"no progress for {quiet_s}s waiting for {what}: {now}\n{w.log_text()[-3000:]}"
        )
        await asyncio.sleep(0.1)


def _partition_of(name: str) -> int:
    return int(name.rsplit("[", 1)[1].rstrip("]"))


async def _phases(w: WorkerProc) -> dict[int, str]:
    status = await w.status()
    assert status is not None
    return {_partition_of(n): p["phase"] for n, p in status["partitions"].items()}


async def _ready(w: WorkerProc) -> bool:
    status = await w.status()
    return bool(status and status["partitions"] and status["ready"])


async def _exact(world: World, w: WorkerProc, by: int) -> None:
    """Every key answers its event count, from version ``by``."""
    keys = [k for ks in world.keys.values() for k in ks] + [world.gate_key]
    table = await read_table([w], "balances", keys)
    wrong = {
        k: table.get(k) for k in keys if table.get(k) is None or table[k]["n"] != world.counts[k]
    }
    assert not wrong, wrong
    assert {table[k]["by"] for k in keys} == {by}


async def test_without_history_a_stateful_agent_catches_up_before_it_is_ready(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    await world.fill()
    try:
        w = world.worker("1", "1", "w.log")
        await _until(w, lambda: world.arrived(1), "the gate reached")
        # inside the replay: nothing is ready, no view answers a value half replayed
        status, body, _ = await _get(w, "/readyz")
        assert status == 503, body
        assert (await _phases(w))[HELD] == "catching_up"
        before_gate = world.keys[HELD][0]  # its first three events are applied already
        status, body, headers = await _get(w, f"/tables/balances/{before_gate}")
        assert status == 503, (status, body)
        assert headers["Retry-After"]
        world.open_gate()
        await _until(w, lambda: _ready(w), "the worker ready")
        await _exact(world, w, by=1)  # the moment it is ready, every key is exact
        status, body, _ = await _get(w, "/status")
        held = next(p for n, p in body["partitions"].items() if _partition_of(n) == HELD)
        assert held["store_position"] == sum(world.counts.values()) + 1  # at the head
        assert held["caught_up"] is True  # the marker: a restart replays nothing
        assert w.stop() == 0, w.log_text()[-3000:]
        assert "caught up" in w.log_text()
    finally:
        world.kill_all()


async def _v1_then_v2_held(world: World) -> WorkerProc:
    """v1 alone to the head, stopped; then v1 and v2, v2 held at the gate while it
    builds (the gate's events are in the store, v1 went past them), v1's partitions live."""
    await world.fill()
    v1 = world.worker("1", "", "v1.log")
    await _until(v1, lambda: _ready(v1), "v1 ready")
    await _exact(world, v1, by=1)
    assert v1.stop() == 0, v1.log_text()[-3000:]
    w = world.worker("1,2", "2", "v2.log")
    await _until(w, lambda: world.arrived(2), "v2's build at the gate")
    await _until(w, lambda: _ready(w), "v1's partitions live")
    return w


async def _switch_to_v2(world: World, w: WorkerProc) -> None:
    """The gate opened: v2 builds to the head and becomes active, its views answer every
    key, and the worker stops cleanly."""
    world.open_gate()

    async def v2_active() -> bool:
        return (await _versions(w)).get(2) == "active"

    await _until(w, v2_active, "v2 active")
    await _exact(world, w, by=2)
    assert w.stop() == 0, w.log_text()[-3000:]


async def _versions(w: WorkerProc) -> dict[int, str]:
    status, body, _ = await _get(w, "/tables")
    assert status == 200, body
    (table,) = body["tables"]
    return {v["version"]: v["state"] for v in table["versions"]}


async def test_without_history_a_new_version_builds_and_is_not_active_before_it_is_built(
    tmp_path: Path,
) -> None:
    world = World(tmp_path)
    try:
        w = await _v1_then_v2_held(world)
        assert await _versions(w) == {1: "active", 2: "building"}
        await _exact(world, w, by=1)  # views answer v1, every key (not v2's 404s)
        await _switch_to_v2(world, w)
    finally:
        world.kill_all()


async def test_the_live_version_takes_new_events_while_a_new_one_builds(tmp_path: Path) -> None:
    world = World(tmp_path)
    try:
        w = await _v1_then_v2_held(world)
        key = world.keys[1][0]  # another partition than the build held at the gate
        await world.append([Event.create("deposit", stream_id=key, data={})])

        async def v1_has_it() -> bool:
            status, body, headers = await _get(w, f"/tables/balances/{key}")
            return status == 200 and headers[HEADER] == "1" and body["n"] == world.counts[key]

        await _until(w, v1_has_it, "the appended event in v1's view")
        # observed in this order: v1 had the new event while v2 was still building
        assert not world.opened
        assert (await _versions(w))[2] == "building"
        await _switch_to_v2(world, w)
    finally:
        world.kill_all()


async def test_partitions_catch_up_and_follow_the_store_while_one_is_held(tmp_path: Path) -> None:
    world = World(tmp_path)
    await world.fill()
    try:
        w = world.worker("1", "1", "w.log")
        await _until(w, lambda: world.arrived(1), "the gate reached")

        async def others_live() -> bool:
            phases = await _phases(w)
            return all(phases[p] == "live" for p in range(PARTITIONS) if p != HELD)

        await _until(w, others_live, "the other partitions live")
        assert (await _phases(w))[HELD] == "catching_up"  # still held at the gate
        key = world.keys[2][0]
        await world.append([Event.create("deposit", stream_id=key, data={})])

        async def followed() -> bool:
            status, body, _ = await _get(w, f"/tables/balances/{key}")
            return status == 200 and body["n"] == world.counts[key]

        await _until(w, followed, "the appended event on another partition")
        assert (await _phases(w))[HELD] == "catching_up"  # the held one did not move
        world.open_gate()
        await _until(w, lambda: _ready(w), "the worker ready")
        await _exact(world, w, by=1)
        assert w.stop() == 0, w.log_text()[-3000:]
    finally:
        world.kill_all()
