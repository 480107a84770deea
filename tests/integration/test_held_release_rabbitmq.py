"""``streamapp parked release`` on real RabbitMQ with a real worker: of three held streams,
the one named by ``--stream`` is released while the handler still fails (its head fails
again and holds it again, its messages parked again, not counted twice), then once it is
fixed (its messages leave the parking queues); the others' messages stay queued, in
order; ``parked list --held`` shows those two and ``streamapp tables`` counts them;
``skip --stream B --event ID --yes`` takes B's messages alone, leaves B's poison out on
purpose (recorded, counted) and releases the rest of B; ``release --all --dry-run``
sends nothing and leaves C's queued, ``release --all`` sends them and releases C, and
takes every held message (a ``parked replay`` after it finds none)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from streamapp import Event
from tests.apps.held_app import fold
from tests.conftest import Services
from tests.support.waits import run_watched, until

from .harness import ROOT, WorkerProc, app_env, streamapp_cmd, wait_ready
from .held_world import read, send, wait_held

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.held_app:app"
NO_KAFKA = "127.0.0.1:1"


async def test_release_one_held_stream_skip_an_event_then_release_all(
    services: Services, tmp_path: Path
) -> None:
    ns = f"hrr{uuid.uuid4().hex[:6]}-"
    source = f"{ns}hs-moves"
    gate = tmp_path / "gate"
    gate.touch()
    env = {
        "STREAMAPP_BROKER": "rabbitmq",
        "STREAMAPP_AMQP_URL": services.amqp,
        "STREAMAPP_TEST_HELD_GATE": str(gate),
    }

    def cli(*args: str) -> str:
        out = run_watched(
            streamapp_cmd(*args, "-A", APP),
            env=app_env(NO_KAFKA, ns, STREAMAPP_WEB_PORT=str(worker.port), **env),
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    a, b, c = "r1", "r2", "r3"
    sent = [
        Event.create(
            "poison" if v == 2 else "moved", stream_id=s, data={"amount": v + i}, version=v
        )
        for v in (1, 2, 3, 4)
        for i, s in enumerate((a, b, c))
    ]

    def folded(sid: str, skip: int | None = None) -> dict[str, int]:
        value = None
        for event in sent:
            if event.stream_id == sid and event.stream_version != skip:
                value = fold(value, event)
        assert value is not None
        return value

    worker = WorkerProc(
        NO_KAFKA, ns, tmp_path / "data", tmp_path / "w.log", app_ref=APP, extra_env=env
    )
    cli("topics", "create")
    worker.start()
    try:
        await wait_ready(worker)
        await send(services.amqp, source, sent)
        await wait_held(worker, 3, 9)
        parking = f"{source}.parked"
        # Released before the handler is fixed: a's 2 fails again and holds a again from
        # it, its copies parked again in order, its held events not counted twice.
        assert "sent 3 held records back" in cli(
            "parked", "release", "--topic", parking, "--stream", a
        )
        again = f"agent apply: stream {a!r} is held from 2 "
        await until(
            lambda: worker.log_text().count(again) == 2,
            what=f"{a} held again from 2",
            progress=worker.log_size,
            stalled_s=60,
        )
        await wait_held(worker, 3, 9)
        assert (await read(worker, [a]))[a][1] == "2"
        gate.unlink()
        assert "dry run: would send 3 held records back" in cli(
            "parked", "release", "--topic", parking, "--stream", a, "--dry-run"
        )
        assert "sent 3 held records back" in cli(
            "parked", "release", "--topic", parking, "--stream", a
        )
        await wait_held(worker, 2, 6)
        got = await read(worker, [a, b, c])
        assert got[a] == (folded(a), None)
        assert (got[b][1], got[c][1]) == ("2", "2")
        listed = sorted(cli("parked", "list", "--held").splitlines())
        assert [line.split("\t")[0] for line in listed] == [b, c]
        assert all("held from 2, 3 events" in line for line in listed), listed
        status = await worker.status()
        assert status is not None
        (line,) = cli("tables").splitlines()
        assert line.endswith(
            f", 2 held streams of agent apply (6 events; worker {status['worker']}: 2)"
        ), line

        gate.touch()  # b's poison can never be applied: skip it, on purpose
        (poison,) = [e for e in sent if e.stream_id == b and e.stream_version == 2]
        skip = ("parked", "skip", "--topic", parking, "--stream", b, "--event", poison.id)
        assert "sent 3 held records back" in cli(*skip, "--yes")  # b's alone
        await wait_held(worker, 1, 3)
        assert (await read(worker, [b]))[b] == (folded(b, skip=2), None)
        assert f"event {poison.id} of held stream {b!r} (version 2) is skipped for good" in (
            worker.log_text()
        )

        gate.unlink()
        every = cli("parked", "release", "--topic", parking, "--all", "--dry-run")
        assert "dry run: would send 3 held records back; nothing sent" in every, every
        assert "sent 3 held records back" in cli(
            "parked", "release", "--topic", parking, "--all"
        )  # c's: the dry run left them queued
        await wait_held(worker, 0, 0)
        want = {s: (folded(s, skip=2 if s == b else None), None) for s in (a, b, c)}
        assert await read(worker, [a, b, c]) == want
        assert "sent 0 records back" in cli("parked", "replay", "--topic", parking)
        status = await worker.status()
        assert status is not None
        skipped = sum(
            lane.get("skipped", 0)
            for p in status["partitions"].values()
            for lane in p["agents"].values()
        )
        assert skipped == 1
        assert "moved on while it was held" not in worker.log_text()
    finally:
        assert worker.stop() == 0
