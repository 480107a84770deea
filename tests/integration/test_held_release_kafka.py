"""``streamapp parked list --held``, ``parked release`` and ``parked skip`` on real Kafka
with a real worker: three streams held among twenty, each parked copy marked with its
stream and place; ``list --held`` shows each with its error; ``release --stream A
--dry-run`` sends nothing, ``release --stream A`` releases A alone (B and C stay held,
their records left for later); ``skip --stream B --event ID --yes`` leaves B's poison
out on purpose, recorded and counted, and releases the rest of B; ``release --all``
sends every held record of the parking topic back (A's and B's again: skipped by their
stream versions, without a warning) and releases C. B's poison is a structured-mode
CloudEvent (its id in the JSON body, not in a header).
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import orjson
import pytest

from streamapp import Event
from streamapp.failures.republish import HELD_PLACE, HELD_STREAM
from tests.apps.held_app import fold
from tests.support.waits import run_watched

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    create_topics,
    produce,
    read_topic,
    streamapp_cmd,
    wait_ready,
)
from .held_world import held_counts, read, wait_held

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.held_app:app"


async def test_release_one_stream_list_the_held_and_skip_an_event(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"hsl{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns, APP)
    source, parking = f"{ns}hs-moves", f"{ns}hs-moves.parked"
    gate = tmp_path / "gate"
    gate.touch()
    env = {"STREAMAPP_TEST_HELD_GATE": str(gate)}
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
    worker = WorkerProc(
        kafka_bootstrap, ns, tmp_path / "data", tmp_path / "w.log", app_ref=APP, extra_env=env
    ).start()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_watched(
            streamapp_cmd("parked", *args, "-A", APP),
            env=app_env(kafka_bootstrap, ns, STREAMAPP_WEB_PORT=str(worker.port), **env),
            cwd=ROOT,
        )

    def folded(sid: str, skip: int | None = None) -> dict[str, int]:
        value = None
        for event in sent:
            if event.stream_id == sid and event.stream_version != skip:
                value = fold(value, event)
        assert value is not None
        return value

    try:
        await wait_ready(worker)
        await produce(kafka_bootstrap, source, sent, structured=frozenset([poison.id]))
        await wait_held(worker, 3, 6)
        marks = sorted(
            (dict(r.headers)[HELD_STREAM].decode(), int(dict(r.headers)[HELD_PLACE]))
            for r in await read_topic(kafka_bootstrap, parking)
        )
        assert marks == sorted((s, n) for s in (a, b, c) for n in (1, 2))

        listed = cli("list", "--held")
        assert listed.returncode == 0, listed.stderr
        lines = sorted(listed.stdout.splitlines())
        assert [line.split("\t")[0] for line in lines] == sorted([a, b, c])
        assert all("held from 2, 2 events" in line for line in lines), lines
        assert all("poison: the handler cannot apply it yet" in line for line in lines)
        rows = [orjson.loads(x) for x in cli("list", "--held", "--json").stdout.splitlines()]
        assert sorted(r["stream"] for r in rows) == sorted([a, b, c])
        assert cli("list").returncode == 2  # --held is the one listing there is

        gate.unlink()  # the handler is fixed
        dry = cli("release", "--topic", parking, "--stream", a, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "dry run: would send 2 held records back; nothing sent" in dry.stdout
        assert dry.stdout.count(f"(stream {a})") == 2
        assert cli("release", "--topic", parking).returncode == 2  # --stream or --all

        one = cli("release", "--topic", parking, "--stream", a)
        assert one.returncode == 0, one.stderr
        assert "sent 2 held records back" in one.stdout
        await wait_held(worker, 2, 4)  # a released, b and c still held
        got = await read(worker, [a, b, c])
        assert got[a] == (folded(a), None)
        assert (got[b][1], got[c][1]) == ("2", "2")

        gate.touch()  # b's poison can never be applied: skip it, on purpose
        refused = cli("skip", "--topic", parking, "--stream", b, "--event", poison.id)
        assert refused.returncode == 2
        assert "--yes" in refused.stderr
        skip = cli("skip", "--topic", parking, "--stream", b, "--event", poison.id, "--yes")
        assert skip.returncode == 0, skip.stderr
        await wait_held(worker, 1, 2)  # c still held
        assert (await read(worker, [b]))[b] == (folded(b, skip=2), None)

        gate.unlink()
        every = cli("release", "--topic", parking, "--all", "--dry-run")
        assert "dry run: would send 6 held records back; nothing sent" in every.stdout
        every = cli("release", "--topic", parking, "--all")
        assert every.returncode == 0, every.stderr
        assert "sent 6 held records back" in every.stdout, every.stdout  # a's and b's again
        await wait_held(worker, 0, 0)
        got = await read(worker, streams)
        assert got[b] == (folded(b, skip=2), None)  # 1 then 3: 2 left out on purpose
        others = {s: got[s] for s in streams if s != b}
        assert others == {s: (folded(s), None) for s in streams if s != b}
        status = await worker.status()
        assert held_counts(status) == (0, 0)
        assert status is not None
        skipped = sum(
            lane.get("skipped", 0)
            for p in status["partitions"].values()
            for lane in p["agents"].values()
        )
        assert skipped == 1
        log = worker.log_text()
        assert f"event {poison.id} of held stream {b!r} (version 2) is skipped for good" in log
        assert "moved on while it was held" not in log
    finally:
        assert worker.stop() == 0
