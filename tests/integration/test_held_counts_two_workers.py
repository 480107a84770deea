"""Held counts gathered from every worker of the group, on real Kafka with two workers:
each owns one partition and holds one stream; ``streamapp parked list --held`` and
``streamapp tables``, asked through one worker's views, count both, and say which
worker answered for each."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from streamapp import Event
from tests.apps.held_app import moves
from tests.support.waits import frozen, until

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    create_topics,
    produce,
    streamapp_cmd,
    wait_group_ready,
)
from .held_world import held_counts

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.held_app:app"


async def test_held_streams_are_counted_on_every_worker_of_the_group(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"hcw{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns, APP)
    gate = tmp_path / "gate"
    gate.touch()
    env = {"STREAMAPP_TEST_HELD_GATE": str(gate)}
    streams = [f"c{i}" for i in range(20)]
    on = {p: next(s for s in streams if moves.partition_of(s.encode()) == p) for p in (0, 1)}
    poisoned = set(on.values())
    sent = [
        Event.create(
            "poison" if v == 2 and sid in poisoned else "moved",
            stream_id=sid,
            data={"amount": v},
            version=v,
        )
        for v in (1, 2, 3)
        for sid in streams
    ]
    workers = [
        WorkerProc(
            kafka_bootstrap,
            ns,
            tmp_path / f"data{n}",
            tmp_path / f"w{n}.log",
            app_ref=APP,
            extra_env=env,
        ).start()
        for n in (1, 2)
    ]
    first = workers[0]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            streamapp_cmd(*args, "-A", APP),
            env=app_env(kafka_bootstrap, ns, STREAMAPP_WEB_PORT=str(first.port), **env),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        return out

    try:
        await wait_group_ready(workers, 2)
        statuses: list[Any] = []

        async def each_holds_one() -> bool:
            statuses[:] = [await w.status() for w in workers]
            return [held_counts(s) for s in statuses] == [(1, 2), (1, 2)]

        await produce(kafka_bootstrap, f"{ns}hs-moves", sent)
        await until(
            each_holds_one,
            what="one held stream on each worker",
            progress=lambda: frozen([held_counts(s) for s in statuses]),
        )
        ids = {s["worker"]: s for s in statuses}
        assert len(ids) == 2
        holder = {
            hold["stream"]: s["worker"]
            for s in statuses
            for p in s["partitions"].values()
            for lane in p["agents"].values()
            for hold in lane.get("held", [])
        }
        assert set(holder) == poisoned

        async def directory_read() -> bool:
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{first.port}/tables") as r,
            ):
                body = await r.json()
            return all(o for t in body["tables"] for o in (t.get("owners") or {}).values()) and any(
                t.get("owners") for t in body["tables"]
            )

        await until(directory_read, what="the other worker's views known to the first")

        listed = cli("parked", "list", "--held")
        lines = sorted(listed.stdout.splitlines())
        assert [line.split("\t")[0] for line in lines] == sorted(poisoned)
        for line in lines:
            assert f"worker {holder[line.split(chr(9))[0]]}\t" in line, line
        assert all(w in listed.stderr for w in ids), listed.stderr  # which answered
        rows = [
            orjson.loads(x) for x in cli("parked", "list", "--held", "--json").stdout.splitlines()
        ]
        assert {r["stream"]: r["worker"] for r in rows} == holder

        tables = cli("tables")
        (line,) = tables.stdout.splitlines()
        per_worker = ", ".join(f"{w}: 1" for w in sorted(ids))
        assert line.endswith(f", 2 held streams of agent apply (4 events; worker {per_worker})"), (
            line
        )
    finally:
        for w in workers:
            w.stop()
