"""``streamapp parked release --stream`` on real RabbitMQ with a real worker: of two held
streams, the one named is released (its messages leave the parking queues); the other's
messages stay queued, in order, and a later ``parked replay`` releases it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from streamapp import Event
from tests.apps.held_app import fold
from tests.conftest import Services
from tests.support.waits import run_watched

from .harness import ROOT, WorkerProc, app_env, streamapp_cmd, wait_ready
from .held_world import read, send, wait_held

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.held_app:app"
NO_KAFKA = "127.0.0.1:1"


async def test_release_one_held_stream_and_leave_the_other_queued(
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
            env=app_env(NO_KAFKA, ns, **env),
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    a, b = "r1", "r2"
    sent = [
        Event.create(
            "poison" if v == 2 else "moved", stream_id=s, data={"amount": v + i}, version=v
        )
        for v in (1, 2, 3, 4)
        for i, s in enumerate((a, b))
    ]

    def folded(sid: str) -> dict[str, int]:
        value = None
        for event in sent:
            if event.stream_id == sid:
                value = fold(value, event)
        assert value is not None
        return value

    cli("topics", "create")
    worker = WorkerProc(
        NO_KAFKA, ns, tmp_path / "data", tmp_path / "w.log", app_ref=APP, extra_env=env
    ).start()
    try:
        await wait_ready(worker)
        await send(services.amqp, source, sent)
        await wait_held(worker, 2, 6)
        gate.unlink()
        parking = f"{source}.parked"
        assert "dry run: would send 3 held records back" in cli(
            "parked", "release", "--topic", parking, "--stream", a, "--dry-run"
        )
        assert "sent 3 held records back" in cli(
            "parked", "release", "--topic", parking, "--stream", a
        )
        await wait_held(worker, 1, 3)
        got = await read(worker, [a, b])
        assert got[a] == (folded(a), None)
        assert got[b][1] == "2"
        assert "sent 3 records back" in cli("parked", "replay", "--topic", parking)
        await wait_held(worker, 0, 0)
        assert await read(worker, [a, b]) == {a: (folded(a), None), b: (folded(b), None)}
    finally:
        assert worker.stop() == 0
