"""``streamapp store parked replay`` in the embedded mode (``STREAMAPP_BROKER=none``), on
SQLite and on PostgreSQL: rows an embedded worker parked while the handler failed go
back, once it is fixed, to the agent that parked them, each once per run; ``--dry-run``
sends nothing; ``--until`` bounds a run; the mark makes a next run send only what was
parked since; a kill -9 and restart applies nothing again; a row that fails again is
parked again.

The app is ``tests/apps/store_replay_app.py``: ``park_ids`` keeps, per stream, the ids
it applied (a table, guarded by stream versions); ``side_effects`` has no tables and
appends each id it handles to a file, so a line written twice is an event run twice.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from streamapp import Event
from streamapp.topics import partition_for
from tests.conftest import PgUrlFactory
from tests.support import waits
from tests.support.waits import run_watched

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    append_to_store,
    read_table,
    streamapp_cmd,
    worker_progress,
)

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
        return run_watched(
            streamapp_cmd("store", "parked", *args[:1], "-A", APP, *args[1:]),
            env=app_env("127.0.0.1:1", self.ns, **self.env),
            cwd=ROOT,
        )

    def parked(self) -> list[dict[str, Any]]:
        listed = run_watched(
            streamapp_cmd("store", "parked", "-A", APP),
            env=app_env("127.0.0.1:1", self.ns, **self.env),
            cwd=ROOT,
        )
        assert listed.returncode == 0, listed.stdout + listed.stderr
        return [orjson.loads(line) for line in listed.stdout.splitlines()]

    def side_ids(self) -> Counter[str]:
        return Counter(self.side.read_text().split()) if self.side.exists() else Counter()


async def until(what: str, check: Callable[[], Any], worker: WorkerProc) -> Any:
    """Until ``check`` (sync or async) gives a true value, and that value; fails once
    neither the worker's log nor its /status moved for a minute, or it died."""
    got: Any = await waits.until(
        check,
        what=what,
        progress=lambda: worker_progress([worker]),
        poll_s=0.3,
        detail=lambda: worker.log_text()[-3000:],
    )
    return got


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


def partition(row: dict[str, Any]) -> int:
    """The source partition of ``row`` (``source``: ``topic/partition/position``)."""
    return int(str(row["source"]).rsplit("/", 2)[1])


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
            assert first.stdout.count(" to agent ") == 2, first.stdout  # a line per row

            def first_run_done() -> bool:  # the dry run sent nothing; the first run 2 rows
                listed = {r["id"]: r["outcome"] for r in w.parked()}
                return listed == {r["id"]: "applied" if r in early else None for r in rows}

            await until("the first run's 2 rows applied, no other row sent", first_run_done, worker)
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
            # A probe on each partition, behind the log's entries: one park_ids row sent
            # again, skipped by stream version. Once each probe has its outcome, the
            # restarted worker has read the log past every earlier entry.
            probes = [
                min(r["id"] for r in rows if agent_of(r) == "park_ids" and partition(r) == p)
                for p in (0, 1)
            ]
            for probe in probes:
                sent = w.cli("replay", "--from", str(probe), "--until", str(probe + 1))
                assert "sent 1 parked row back" in sent.stdout, sent.stdout + sent.stderr

            def probed() -> bool:
                listed = {r["id"]: r["outcome"] for r in w.parked()}
                return all(listed[probe] == "filtered" for probe in probes)

            await until("both probes run (filtered: applied already)", probed, worker)
            status = await wait_status(worker)
            assert outcomes(status, "park_ids") == {"filtered": 2}  # the probes only
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
            assert outcomes(status, "park_ids")["filtered"] == 2 + 4  # applied already: skipped
            assert await exact()
            w.gate.unlink()
            last = w.cli("replay")
            assert "sent 4 parked rows back" in last.stdout, last.stdout
            twice = {ids[s]: 2 for s in gated} | {ids[s]: 1 for s in good}
            await until("gated side effects run twice", lambda: w.side_ids() == twice, worker)
            again_ids = {r["id"] for r in again_parked}

            def settled() -> bool:  # the last run's rows have run: nothing more will
                listed = {r["id"]: r["outcome"] for r in w.parked()}
                return all(listed[i] == "applied" for i in again_ids)

            await until("the last run's 4 rows applied", settled, worker)
            assert w.side_ids() == twice
            assert "sent back by a replay" not in worker.log_text()  # no stream moved on
        finally:
            assert worker.stop() == 0, worker.log_text()[-3000:]


async def test_a_row_whose_stream_moved_on_is_filtered_with_a_warning_and_listed_so(
    tmp_path: Path, store_url: Callable[[], contextlib.AbstractAsyncContextManager[str]]
) -> None:
    """A parked event whose stream applied a later event meanwhile is skipped by stream
    version when sent back: the worker logs a WARNING naming the row, the stream, both
    versions and the rebuild, and ``store parked`` lists it ``filtered`` beside a row
    that ``applied``."""
    async with store_url() as url:
        w = World(tmp_path, url)
        w.gate.touch()
        worker = w.worker()
        try:
            await wait_status(worker)
            moved, kept = streams("mv")[0], streams("kp")[0]
            failed = Event.create("gated", stream_id=moved, data={})
            alone = Event.create("gated", stream_id=kept, data={})
            later = Event.create("fine", stream_id=moved, data={})  # version 2 of moved
            await append_to_store(url, [failed, alone])
            await append_to_store(url, [later])
            rows = await until("4 rows parked", lambda: len(w.parked()) == 4 and w.parked(), worker)
            assert {r["outcome"] for r in rows} == {None}  # never sent back

            async def later_applied() -> bool:
                return (await read_table([worker], "applied", [moved]))[moved] == [later.id]

            await until("the stream's later event applied", later_applied, worker)
            w.gate.unlink()  # the handler is fixed
            sent = w.cli("replay")
            assert sent.returncode == 0, sent.stderr
            assert "sent 4 parked rows back" in sent.stdout, sent.stdout
            assert sent.stdout.count(" to agent ") == 4, sent.stdout

            def ran() -> list[dict[str, Any]] | None:
                listed = w.parked()
                done = all(r["outcome"] not in (None, "pending") for r in listed)
                return listed if done else None

            listed = await until("every row sent back run", ran, worker)
            by_id = {r["id"]: r for r in listed}
            row = next(r for r in rows if agent_of(r) == "park_ids" and event_id(r) == failed.id)
            expected = {r["id"]: "applied" for r in rows} | {row["id"]: "filtered"}
            assert {i: r["outcome"] for i, r in by_id.items()} == expected
            table = await read_table([worker], "applied", [moved, kept])
            assert table == {moved: [later.id], kept: [alone.id]}  # moved misses it

            warnings = [
                line for line in worker.log_text().splitlines() if "sent back by a replay" in line
            ]
            assert len(warnings) == 1, warnings
            (line,) = warnings
            assert "WARNING" in line, line
            for part in (
                f"agent park_ids skipped parked row {row['id']}",
                f"its stream {moved!r} moved on",
                "the event is stream version 1",
                "table applied has applied the stream through version 2",
                "new table version",
                "streamapp reset -A MODULE:app --agent park_ids --yes",
            ):
                assert part in line, (part, line)
        finally:
            assert worker.stop() == 0, worker.log_text()[-3000:]


def event_id(row: dict[str, Any]) -> str:
    """The CloudEvent id of the stored event ``row`` parked."""
    return str(orjson.loads(row["value"])["id"])
