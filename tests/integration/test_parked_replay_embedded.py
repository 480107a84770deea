"""``streamapp store parked replay`` in the embedded mode (``STREAMAPP_BROKER=none``), on
SQLite and on PostgreSQL: rows a store-only worker parked while the handler failed go
back, once it is fixed, to the agent that parked them, each once per run; ``--dry-run``
sends nothing; ``--until`` bounds a run; the mark makes a next run send only what was
parked since; a kill -9 and restart applies nothing again; a row that fails again is
parked again.

The app is ``tests/apps/store_replay_app.py``: ``park_ids`` keeps, per stream, the ids
it applied (a table, guarded by stream versions); ``side_effects`` has no tables and
appends each id it handles to a file, so a line written twice is an event run twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from streamapp import Event
from streamapp.partitioner import partition_for
from tests.conftest import PgUrlFactory

from .harness import ROOT, WorkerProc, app_env, append_to_store, read_table, streamapp_cmd

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.store_replay_app:app"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Callable[[], contextlib.AbstractAsyncContextManager[str]]:
    if request.param == "sqlite":

        @contextlib.asynccontextmanager
        async def sqlite() -> AsyncIterator[str]:
            yield f"sqlite:///{tmp_path / 'events.db'}"

        return sqlite
    factory: PgUrlFactory = request.getfixturevalue("pg_url_factory")
    return factory


def streams(prefix: str) -> list[str]:
    """Two stream ids on each partition of a 2-partition topic."""
    out: list[str] = []
    for p in (0, 1):
        out += [
            f"{prefix}{i}" for i in range(100) if partition_for(f"{prefix}{i}".encode(), 2) == p
        ][:2]
    return out


class World:
    def __init__(self, tmp: Path, url: str) -> None:
        self.tmp, self.url = tmp, url
        self.ns = f"spr{uuid.uuid4().hex[:6]}-"
        self.gate, self.side = tmp / "gate", tmp / "side.txt"
        self.env = {
            "STREAMAPP_BROKER": "none",
            "STREAMAPP_EVENT_STORE": url,
            "STREAMAPP_TEST_REPLAY_GATE": str(self.gate),
            "STREAMAPP_TEST_SIDE_FILE": str(self.side),
        }

    def worker(self) -> WorkerProc:
        return WorkerProc(
            "127.0.0.1:1",  # no broker
            self.ns,
            self.tmp / "data",
            self.tmp / "worker.log",
            app_ref=APP,
            extra_env=dict(self.env),
        ).start()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            streamapp_cmd("store", "parked", *args[:1], "-A", APP, *args[1:]),
            env=app_env("127.0.0.1:1", self.ns, **self.env),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def parked(self) -> list[dict[str, Any]]:
        listed = subprocess.run(
            streamapp_cmd("store", "parked", "-A", APP),
            env=app_env("127.0.0.1:1", self.ns, **self.env),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return [orjson.loads(line) for line in listed.stdout.splitlines()]

    def side_ids(self) -> Counter[str]:
        return Counter(self.side.read_text().split()) if self.side.exists() else Counter()


async def until(
    what: str, check: Callable[[], Any], worker: WorkerProc, within_s: float = 60
) -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        assert worker.alive, worker.log_text()[-3000:]
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        await asyncio.sleep(0.3)
    raise AssertionError(f"not within {within_s}s: {what}\n{worker.log_text()[-3000:]}")


async def wait_status(worker: WorkerProc) -> dict[str, Any]:
    async def ready() -> dict[str, Any] | None:
        status = await worker.status()
        if status is None or not status.get("partitions"):
            return None
        phases = {p.get("phase") for p in status["partitions"].values()}
        return status if phases == {"live"} else None

    got: dict[str, Any] = await until("every partition live", ready, worker)
    return got


def agent_of(row: dict[str, Any]) -> str:
    """The agent that parked ``row`` (its ``streamapp-agent`` header)."""
    return str(next(h["value"] for h in row["headers"] if h["name"] == "streamapp-agent"))


def outcomes(status: dict[str, Any], agent: str) -> Counter[str]:
    total: Counter[str] = Counter()
    for p in status["partitions"].values():
        total.update(p["agents"][agent]["outcomes"])
    return total


async def test_parked_rows_go_back_to_their_agent_once_per_run(
    tmp_path: Path, store_url: Callable[[], contextlib.AbstractAsyncContextManager[str]]
) -> None:
    async with store_url() as url:
        w = World(tmp_path, url)
        w.gate.touch()
        worker = w.worker()
        try:
            await wait_status(worker)
            gated, good = streams("g"), streams("ok")
            events = [Event.create("gated", stream_id=s, data={}) for s in gated]
            events += [Event.create("fine", stream_id=s, data={}) for s in good]
            ids = {e.stream_id: e.id for e in events}
            await append_to_store(url, events)
            rows = await until("8 rows parked", lambda: len(w.parked()) == 8 and w.parked(), worker)
            assert Counter(agent_of(r) for r in rows) == {
                "park_ids": 4,
                "side_effects": 4,
            }
            await until("good events handled", lambda: len(w.side_ids()) == 4, worker)
            table = await read_table([worker], "applied", gated + good)
            assert all(table[s] is None for s in gated)
            assert {s: table[s] for s in good} == {s: [ids[s]] for s in good}
            w.gate.unlink()  # the handler is fixed

            dry = w.cli("replay", "--dry-run")
            assert dry.returncode == 0, dry.stderr
            assert (
                "dry run: would send 8 parked rows back (park_ids: 4, side_effects: 4); "
                "nothing sent"
            ) in dry.stdout, dry.stdout
            assert dry.stdout.count("would send parked row ") == 8

            bad = w.cli("replay", "--destination", f"{w.ns}sp-events")
            assert bad.returncode == 2
            assert "--destination" in bad.stderr
            assert f"it has {w.ns}sp.parked" in bad.stderr

            third = sorted(r["id"] for r in rows)[2]
            first = w.cli("replay", "--until", str(third))
            assert first.returncode == 0, first.stderr
            assert "sent 2 parked rows back to their agents" in first.stdout, first.stdout
            early = [r for r in rows if r["id"] < third]
            await asyncio.sleep(3)  # the dry run sent nothing; the first run sent 2 rows
            status = await wait_status(worker)
            handled = outcomes(status, "park_ids") + outcomes(status, "side_effects")
            assert handled["delivered"] == 4 + 4 + 2, handled  # good (x2 agents), then 2
            assert sum(w.side_ids().values()) == 4 + sum(
                agent_of(r) == "side_effects" for r in early
            )

            rest = w.cli("replay")
            assert rest.returncode == 0, rest.stderr
            assert "sent 6 parked rows back to their agents" in rest.stdout, rest.stdout
            again = w.cli("replay")
            assert again.returncode == 0, again.stderr
            assert "sent 0 parked rows back" in again.stdout  # the mark: nothing since

            async def exact() -> bool:
                table = await read_table([worker], "applied", gated + good)
                return table == {s: [ids[s]] for s in gated + good}

            await until("every gated stream applied once", exact, worker)
            await until("every side effect run once", lambda: len(w.side_ids()) == 8, worker)
            assert set(w.side_ids().values()) == {1}
            assert len(w.parked()) == 8  # none failed again

            worker.kill()  # kill -9: the marks are durable, nothing runs twice
            worker = w.worker()
            status = await wait_status(worker)
            await asyncio.sleep(3)  # several polls of the resend log
            status = await wait_status(worker)
            assert not outcomes(status, "park_ids")
            assert not outcomes(status, "side_effects")
            assert set(w.side_ids().values()) == {1}
            assert await exact()

            w.gate.touch()  # broken again: rows sent back again are parked again
            resend = w.cli("replay", "--from", "1")
            assert resend.returncode == 0, resend.stderr
            assert "sent 8 parked rows back" in resend.stdout
            later = await until(
                "4 parked again", lambda: len(w.parked()) == 12 and w.parked(), worker
            )
            again_parked = [r for r in later if r["id"] > max(r["id"] for r in rows)]
            assert {r["source"] for r in again_parked} == {
                r["source"] for r in rows if agent_of(r) == "side_effects"
            }
            status = await wait_status(worker)
            assert outcomes(status, "park_ids")["filtered"] == 4  # applied already: skipped
            assert await exact()
            w.gate.unlink()
            last = w.cli("replay")
            assert "sent 4 parked rows back" in last.stdout, last.stdout
            twice = {ids[s]: 2 for s in gated} | {ids[s]: 1 for s in good}
            await until("gated side effects run twice", lambda: w.side_ids() == twice, worker)
            await asyncio.sleep(2)  # and no more
            assert w.side_ids() == twice
        finally:
            assert worker.stop() == 0, worker.log_text()[-3000:]
