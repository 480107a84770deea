"""Held streams on real RabbitMQ, with real worker processes: the scenario of
``tests/integration/held_world.py``.

Events are appended to the event store and published to the app's exchange in the same
order, as the forwarder does. The first worker is killed (``kill -9``) during the hold;
the next one starts on an empty data directory, so its partitions are rebuilt from the
event store: the poison events fail again and hold their streams again (parked once
more: parking is at least once), the views answer with the held header, and new live
events of the held streams park behind. It is killed during the hold too; the worker
after it resumes from its local store (the holds are in its checkpoint write).
``streamapp parked replay`` sends the parking queues' messages back; a ``kill -9``
during the release (SIGKILL at the first held event the fixed handler applies) and live
events during the release (one queued ahead of the held ones, parked after the replay
took the queues; one while the replay sends) leave every stream equal to the fixed
handler's fold after one replay, and to ``streamapp verify``'s rebuild of every stream
from the event store.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tests.conftest import Services
from tests.support.waits import run_watched

from .harness import ROOT, WorkerProc, app_env, streamapp_cmd, wait_ready
from .held_world import (
    POISONED,
    events,
    expected,
    held_meta,
    later,
    publish,
    verify,
    wait_held,
    wait_killed,
    wait_table,
)

# make acceptance runs it (scripts/acceptance): several workers, 1,000 streams and kill -9s,
# too heavy beside make test's other files on two cores; make test keeps the lighter
# test_held_park_crash and test_held_release_* on this transport, and the embedded scenario.
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.acceptance]

APP = "tests.apps.held_app:app"
NO_KAFKA = "127.0.0.1:1"


async def test_held_streams_are_exact_through_kill_9_and_released_in_order(
    services: Services, tmp_path: Path
) -> None:
    amqp = services.amqp
    ns = f"hsr{uuid.uuid4().hex[:6]}-"
    source = f"{ns}hs-moves"
    store = f"sqlite:///{tmp_path / 'events.db'}"
    gate = tmp_path / "gate"
    gate.touch()
    env = {
        "STREAMAPP_BROKER": "rabbitmq",
        "STREAMAPP_AMQP_URL": amqp,
        "STREAMAPP_EVENT_STORE": store,
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

    def worker(data: str, **extra: str) -> WorkerProc:
        log = tmp_path / "worker.log"
        return WorkerProc(
            NO_KAFKA, ns, tmp_path / data, log, app_ref=APP, extra_env=env | extra
        ).start()

    cli("topics", "create")
    first = worker("one")
    sent = events()
    try:
        await wait_ready(first)
        await publish(amqp, store, source, sent)
        await wait_table(first, expected(sent, held=True), set(POISONED))
        await wait_held(first, 5, 10)
    finally:
        first.kill()  # kill -9 during the hold

    # A worker on an empty data directory: the holds come back from the event store.
    second = worker("two")
    try:
        await wait_ready(second)
        await wait_held(second, 5, 10)
        await wait_table(second, expected(sent, held=True), set(POISONED))
        live = later(4)
        await publish(amqp, store, source, live)
        sent += live
        await wait_held(second, 5, 15)
        await wait_table(second, expected(sent, held=True), set(POISONED))
        assert (await held_meta(second, POISONED[0]))["events"] == 3
    finally:
        second.kill()  # kill -9 during the hold, again

    gate.unlink()  # the handler is fixed
    # Live events of the held streams while the release is under way: one queued ahead
    # of the held ones (parked after the replay took the parking queues: no replay
    # sends it), one while the replay sends.
    early = later(5)
    await publish(amqp, store, source, early)
    sent += early
    more = later(6)
    sending = asyncio.create_task(publish(amqp, store, source, more))
    replayed = await asyncio.to_thread(cli, "parked", "replay", "--topic", f"{source}.parked")
    # 10 by the first worker, 10 again by the second (its rebuild), 5 live behind: 25
    assert "sent 25 records back" in replayed, replayed
    await sending
    sent += more
    releasing = worker("two", STREAMAPP_TEST_HELD_KILL=str(tmp_path / "killed"))
    try:
        await wait_killed(releasing)  # kill -9 at its first held event applied
    finally:
        releasing.kill()

    third = worker("two")
    try:
        await wait_ready(third)
        await wait_held(third, 0, 0)  # one replay: the live events came behind the held
        await wait_table(third, expected(sent, held=False), set())
        assert verify(third, env, store)["checked"] == len(expected(sent, held=False))
        log = third.log_text()
        assert "is released: its held events are applied, in order" in log
        assert "moved on while it was held" not in log
    finally:
        assert third.stop() == 0
