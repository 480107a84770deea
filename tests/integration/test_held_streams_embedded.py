"""Held streams in the embedded mode (``STREAMAPP_BROKER=none``, SQLite), with real
worker processes: the scenario of ``tests/integration/held_world.py``.

The store is the live source; a held stream's events are parked as rows of the store and
``streamapp store parked replay`` sends them back through the lane that held them. A
``kill -9`` during the hold and one during the release (SIGKILL at the first held event
the fixed handler applies) resume from the store's
checkpoint (the holds are in it); with live events of the held streams during the
release, one ``store parked replay`` leaves every stream equal to the fixed handler's fold
and to ``streamapp verify``'s rebuild of every stream from the store.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tests.support.waits import run_watched

from .harness import ROOT, WorkerProc, app_env, append_to_store, streamapp_cmd, wait_ready
from .held_world import (
    POISONED,
    events,
    expected,
    held_meta,
    later,
    verify,
    wait_held,
    wait_killed,
    wait_table,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.held_app:app"
NO_KAFKA = "127.0.0.1:1"


def store_replay(ns: str, env: dict[str, str]) -> str:
    """``streamapp store parked replay``: its output."""
    out = run_watched(
        streamapp_cmd("store", "parked", "replay", "-A", APP),
        env=app_env(NO_KAFKA, ns, **env),
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_held_streams_are_exact_through_kill_9_and_released_in_order(
    tmp_path: Path,
) -> None:
    ns = f"hse{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    gate = tmp_path / "gate"
    gate.touch()
    env = {
        "STREAMAPP_BROKER": "none",
        "STREAMAPP_EVENT_STORE": url,
        "STREAMAPP_TEST_HELD_GATE": str(gate),
    }

    def worker(**extra: str) -> WorkerProc:
        log = tmp_path / "worker.log"
        return WorkerProc(
            NO_KAFKA, ns, tmp_path / "data", log, app_ref=APP, extra_env=env | extra
        ).start()

    def replay() -> str:
        return store_replay(ns, env)

    sent = events()
    await append_to_store(url, sent)
    first = worker()
    try:
        await wait_ready(first)
        await wait_table(first, expected(sent, held=True), set(POISONED))
        await wait_held(first, 5, 10)
    finally:
        first.kill()  # kill -9 during the hold

    second = worker()
    try:
        await wait_ready(second)
        await wait_held(second, 5, 10)  # the holds are in the store's checkpoint write
        live = later(4)
        await append_to_store(url, live)
        sent += live
        await wait_held(second, 5, 15)
        await wait_table(second, expected(sent, held=True), set(POISONED))
        assert (await held_meta(second, POISONED[0]))["events"] == 3
    finally:
        second.kill()  # kill -9 during the hold, again

    gate.unlink()  # the handler is fixed
    # Live events of the held streams while the release is under way: one in the store
    # before the rows go back (parked after the replay took the rows: no replay sends
    # it), one while the replay sends.
    early = later(5)
    await append_to_store(url, early)
    sent += early
    more = later(6)
    appending = asyncio.create_task(append_to_store(url, more))
    assert "sent 15 parked rows back" in await asyncio.to_thread(replay)
    await appending
    sent += more
    releasing = worker(STREAMAPP_TEST_HELD_KILL=str(tmp_path / "killed"))
    try:
        await wait_killed(releasing)  # kill -9 at its first held event applied
    finally:
        releasing.kill()

    third = worker()
    try:
        await wait_ready(third)
        await wait_held(third, 0, 0)  # one replay: the live events came behind the held
        await wait_table(third, expected(sent, held=False), set())
        assert verify(third, env, url)["checked"] == len(expected(sent, held=False))
        log = third.log_text()
        assert "is released: its held events are applied, in order" in log
        assert "moved on while it was held" not in log
    finally:
        assert third.stop() == 0


async def test_holds_are_rebuilt_from_the_store_on_an_empty_data_dir(tmp_path: Path) -> None:
    """A worker on an empty data directory rebuilds its tables from the event store: the
    poison events fail again and hold their streams again (parked once more: parking is
    at least once); the release then applies each held event once, in order."""
    ns = f"hsb{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    gate = tmp_path / "gate"
    gate.touch()
    env = {
        "STREAMAPP_BROKER": "none",
        "STREAMAPP_EVENT_STORE": url,
        "STREAMAPP_TEST_HELD_GATE": str(gate),
    }

    def worker(data: str) -> WorkerProc:
        log = tmp_path / f"{data}.log"
        return WorkerProc(
            NO_KAFKA, ns, tmp_path / data, log, app_ref=APP, extra_env=dict(env)
        ).start()

    sent = events(streams=900)  # the five poisoned among them
    await append_to_store(url, sent)
    first = worker("one")
    try:
        await wait_ready(first)
        await wait_held(first, 5, 10)
    finally:
        first.kill()
    second = worker("two")  # empty: rebuilt from the store
    try:
        await wait_ready(second)
        await wait_held(second, 5, 10)
        await wait_table(second, expected(sent, held=True), set(POISONED))
        gate.unlink()
        # each held event parked twice; the second copy is skipped by stream version
        assert "sent 20 parked rows back" in store_replay(ns, env)
        await wait_held(second, 0, 0)
        await wait_table(second, expected(sent, held=False), set())
    finally:
        assert second.stop() == 0
