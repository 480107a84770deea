"""A RabbitMQ worker frozen past the session timeout (SIGSTOP), then woken (SIGCONT).

While it was frozen the others declared it gone and took its partitions; their
heartbeats queued up for it. Waking, it reads them before deciding who is gone: it never
thinks itself alone, never claims partitions the others hold, and the state stays exact.
"""

from __future__ import annotations

import re
import signal
import uuid
from pathlib import Path

import pytest

from tests.conftest import Services

from .harness import (
    StreamappProc,
    WorkerProc,
    append_to_store,
    around_traceback,
    order_events,
    wait_group_ready,
)
from .test_rabbitmq import rabbit_env, topics_create
from .test_rabbitmq_group import _drained, _read_exact

# serial: it takes a shared service down, freezes a process or skews a clock (run alone)
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.serial]

HEARTBEAT_MS = 300
SESSION_TIMEOUT_MS = 2000
HOLDS = re.compile(r"member (\S+) of (\d+) holds (.*?) \(waiting for")


async def test_a_member_waking_from_a_freeze_hears_the_others_before_it_claims(
    services: Services, tmp_path: Path
) -> None:
    ns = f"rf{uuid.uuid4().hex[:6]}-"
    store = f"sqlite:///{tmp_path / 'events.db'}"
    env = rabbit_env(
        services.amqp,
        STREAMAPP_EVENT_STORE=store,
        STREAMAPP_POLL_TIMEOUT_MS="200",
        STREAMAPP_AMQP_HEARTBEAT_MS=str(HEARTBEAT_MS),
        STREAMAPP_AMQP_SESSION_TIMEOUT_MS=str(SESSION_TIMEOUT_MS),
    )
    topics_create(ns, env)
    events, expected = order_events(500, 4000)
    first, later = events[:3000], events[3000:]
    await append_to_store(store, first)
    forwarder = StreamappProc(
        ("forward", "-A", "agents.orders:app"), "127.0.0.1:1", ns, tmp_path / "fwd.log", env
    ).start()
    workers = [
        WorkerProc("127.0.0.1:1", ns, tmp_path / n, tmp_path / f"{n}.log", extra_env=dict(env))
        for n in ("frozen", "w2", "w3")
    ]
    for w in workers:
        w.start()
    frozen, others = workers[0], workers[1:]
    try:
        await wait_group_ready(workers, 8)
        await _drained(services.amqp, ns, store, len(first), 120)
        assert frozen.proc is not None
        frozen.proc.send_signal(signal.SIGSTOP)
        try:  # the others see it gone and take its partitions (it stays the active
            await wait_group_ready(others, 8, stalled_s=60)  # consumer of their queues)
        finally:
            woke_at = len(frozen.log_text())
            frozen.proc.send_signal(signal.SIGCONT)
        await append_to_store(store, later)
        await wait_group_ready(workers, 8, stalled_s=90)
        await _drained(services.amqp, ns, store, len(events), 120)
        await _read_exact(workers, expected)

        after = frozen.log_text()[woke_at:]
        assert "not heard for" not in after, after[-3000:]  # nobody declared gone
        holds = HOLDS.findall(after)
        assert holds, after[-3000:]
        for _, members, held in holds:  # never alone, never more than its share
            assert int(members) == 3, (members, held)
            assert len(held.split()) <= 3, held
        assert "stalled" in after, after[-3000:]  # it saw its own freeze
        for w in workers:
            assert w.stop() == 0
            assert "Traceback" not in w.log_text(), around_traceback(w.log_text())
    finally:
        forwarder.kill()
        for w in workers:
            if w.alive:
                w.kill()
