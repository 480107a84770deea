"""``streamapp store parked release`` and ``store parked skip`` in the embedded mode
(``STREAMAPP_BROKER=none``, SQLite) with a real worker: three streams held among twenty;
``parked list --held`` shows them, ``streamapp tables`` counts them; ``release --stream
A --dry-run`` sends nothing, ``release --stream A`` releases A alone; ``skip --stream B
--event ID --yes`` leaves B's poison out on purpose (recorded, counted) and releases the
rest of B; neither moves the replay mark, so a later ``store parked replay`` still sends
C's rows and releases C. A stream D held after that is released by ``store parked
release --all`` (its rows alone: the others were sent back before). ``parked release``
(the broker form) names the store form.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import orjson
import pytest

from streamapp import Event
from tests.apps.held_app import fold

from .harness import ROOT, WorkerProc, app_env, append_to_store, streamapp_cmd, wait_ready
from .held_world import held_counts, read, wait_held

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.held_app:app"
NO_KAFKA = "127.0.0.1:1"


async def test_release_one_stream_skip_an_event_and_keep_the_replay_mark(
    tmp_path: Path,
) -> None:
    ns = f"hre{uuid.uuid4().hex[:6]}-"
    url = f"sqlite:///{tmp_path / 'events.db'}"
    gate = tmp_path / "gate"
    gate.touch()
    env = {
        "STREAMAPP_BROKER": "none",
        "STREAMAPP_EVENT_STORE": url,
        "STREAMAPP_TEST_HELD_GATE": str(gate),
    }
    streams = [f"s{i}" for i in range(20)]
    a, b, c = "s3", "s11", "s15"
    sent = [
        Event.create(
            "poison" if (sid, v) in ((a, 2), (b, 2), (c, 2)) else "moved",
            stream_id=sid,
            data={"amount": v * 10 + i},
            version=v,
        )
        for v in (1, 2, 3)
        for i, sid in enumerate(streams)
    ]
    (poison,) = [e for e in sent if e.stream_id == b and e.stream_version == 2]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            streamapp_cmd(*args, "-A", APP),
            env=app_env(NO_KAFKA, ns, STREAMAPP_WEB_PORT=str(worker.port), **env),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def folded(sid: str, skip: int | None = None) -> dict[str, int]:
        value = None
        for event in sent:
            if event.stream_id == sid and event.stream_version != skip:
                value = fold(value, event)
        assert value is not None
        return value

    def outcomes() -> dict[str, list[str | None]]:
        out = cli("store", "parked")
        assert out.returncode == 0, out.stderr
        rows = [orjson.loads(line) for line in out.stdout.splitlines()]
        by_stream: dict[str, list[str | None]] = {}
        for row in rows:
            headers = {h["name"]: h.get("value") for h in row["headers"]}
            stream = headers["streamapp-held-stream"]
            by_stream.setdefault(stream, []).append(row["outcome"])
        return by_stream

    await append_to_store(url, sent)
    worker = WorkerProc(
        NO_KAFKA, ns, tmp_path / "data", tmp_path / "w.log", app_ref=APP, extra_env=env
    ).start()
    try:
        await wait_ready(worker)
        await wait_held(worker, 3, 6)
        listed = cli("parked", "list", "--held")
        assert listed.returncode == 0, listed.stderr
        lines = sorted(listed.stdout.splitlines())
        assert [line.split("\t")[0] for line in lines] == sorted([a, b, c])
        assert all("held from 2, 2 events" in line for line in lines), lines
        status = await worker.status()
        assert status is not None
        tables = cli("tables")
        assert tables.stdout.rstrip().endswith(
            f", 3 held streams of agent apply (6 events; worker {status['worker']}: 3)"
        ), tables.stdout
        gate.unlink()  # the handler is fixed

        broker_form = cli("parked", "release", "--topic", f"{ns}hs-moves.parked", "--all")
        assert broker_form.returncode == 2
        assert "streamapp store parked release" in broker_form.stderr

        dry = cli("store", "parked", "release", "--stream", a, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "dry run: would send 2 held rows back" in dry.stdout
        assert dry.stdout.count(f"stream {a})") == 2
        assert outcomes()[a] == [None, None]  # nothing sent
        assert cli("store", "parked", "release").returncode == 2  # --stream or --all

        one = cli("store", "parked", "release", "--stream", a)
        assert one.returncode == 0, one.stderr
        assert "sent 2 held rows back" in one.stdout
        await wait_held(worker, 2, 4)  # a released; b and c still held
        got = await read(worker, [a, b, c])
        assert got[a] == (folded(a), None)
        assert (got[b][1], got[c][1]) == ("2", "2")

        gate.touch()  # b's poison can never be applied: skip it, on purpose
        refused = cli("store", "parked", "skip", "--stream", b, "--event", poison.id)
        assert refused.returncode == 2
        assert "--yes" in refused.stderr
        skip = cli("store", "parked", "skip", "--stream", b, "--event", poison.id, "--yes")
        assert skip.returncode == 0, skip.stderr
        assert "skip it, in place of parked row" in skip.stdout
        await wait_held(worker, 1, 2)
        got = await read(worker, [b])
        assert got[b] == (folded(b, skip=2), None)  # 1 then 3: 2 left out on purpose
        log = worker.log_text()
        assert f"event {poison.id} of held stream {b!r} (version 2) is skipped for good" in log

        gate.unlink()
        every = cli("store", "parked", "release", "--all", "--dry-run")  # c's rows alone
        assert "dry run: would send 2 held rows back" in every.stdout, every.stdout
        assert every.stdout.count(f"stream {c})") == 2
        replay = cli("store", "parked", "replay")  # the mark is where neither run moved it
        assert replay.returncode == 0, replay.stderr
        assert "sent 2 parked rows back" in replay.stdout, replay.stdout
        await wait_held(worker, 0, 0)

        gate.touch()
        d = "late"
        late = [
            Event.create(
                "poison" if v == 2 else "moved", stream_id=d, data={"amount": v}, version=v
            )
            for v in (1, 2, 3)
        ]
        await append_to_store(url, late)
        sent += late
        await wait_held(worker, 1, 2)
        gate.unlink()
        every = cli("store", "parked", "release", "--all")
        assert every.returncode == 0, every.stderr
        assert "sent 2 held rows back" in every.stdout, every.stdout  # d's alone
        assert every.stdout.count(f"stream {d})") == 2
        await wait_held(worker, 0, 0)
        streams.append(d)
        got = await read(worker, streams)
        assert got == {s: (folded(s, skip=2 if s == b else None), None) for s in streams}
        status = await worker.status()
        assert held_counts(status) == (0, 0)
        assert status is not None
        skipped = sum(
            lane.get("skipped", 0)
            for p in status["partitions"].values()
            for lane in p["agents"].values()
        )
        assert skipped == 1
    finally:
        assert worker.stop() == 0
