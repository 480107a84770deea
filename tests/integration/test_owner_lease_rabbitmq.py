"""A RabbitMQ member cut off from the broker claims nothing and stops answering as owner
(issues 33 and 34's first point).

Three workers of the reference app, events appended to the store at a modest rate and
published by ``streamapp forward``; every key is read from every worker in rounds. One
worker runs with its own group id, and iptables drops its packets to RabbitMQ's port for
~12 s (its HTTP port still answers), then lets them through again. It hears nobody
meanwhile and calls the others gone, but its own heartbeats do not come back: its lease
lapses, and it takes none of their partitions. No answer is older than one served before.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from streamapp import Event
from tests.conftest import Services

from .applying import Applying
from .cutoff import Reads, cut_group, get, heal, iptables, print_logs, read_rounds
from .harness import StreamappProc, WorkerProc, append_to_store, order_events, wait_group_ready
from .test_rabbitmq import rabbit_env, topics_create
from .test_rabbitmq_group import _drained, _read_exact

# serial: it changes the machine's firewall (run alone)
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.serial]

AMQP_PORT = "5672"
CUT_S = 12.0  # 4 session timeouts (3 s); make acceptance cuts for 5 minutes
RATE = 150  # events a second
LEASE_S = 3.0 * 2 / 3  # the default owner_lease_s: amqp_session_timeout_ms 3000
MAX_GAP_S = 10.0
"""The longest a partition may go without applying while events for it are published."""


async def _append(store: str, events: list[Event], done: asyncio.Event) -> None:
    """Append ``events`` to the store, RATE a second."""
    started = time.monotonic()
    for i in range(0, len(events), RATE // 5):
        await append_to_store(store, events[i : i + RATE // 5])
        ahead = (i + RATE // 5) / RATE - (time.monotonic() - started)
        if ahead > 0:
            await asyncio.sleep(ahead)
    done.set()


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "cut_s",
    [CUT_S, pytest.param(300.0, marks=pytest.mark.acceptance, id="5min")],
    ids=lambda s: f"{s:.0f}s",
)
async def test_a_member_cut_off_from_rabbitmq_claims_nothing_and_stops_answering_as_owner(
    services: Services, tmp_path: Path, cut_s: float
) -> None:
    assert os.geteuid() == 0, "iptables and another group id need root"
    cut_gid = cut_group()
    ns = f"lr{uuid.uuid4().hex[:6]}-"
    store = f"sqlite:///{tmp_path / 'events.db'}"
    env = rabbit_env(services.amqp, STREAMAPP_EVENT_STORE=store, STREAMAPP_POLL_TIMEOUT_MS="200")
    topics_create(ns, env)
    events, expected = order_events(n_orders=300, n_events=int(RATE * (cut_s + 20)))
    keys = sorted(expected)
    first = 600
    await append_to_store(store, events[:first])
    forwarder = StreamappProc(
        ("forward", "-A", "agents.orders:app"), "127.0.0.1:1", ns, tmp_path / "fwd.log", env
    ).start()
    cut = WorkerProc(
        "127.0.0.1:1",
        ns,
        tmp_path / "cut",
        tmp_path / "cut.log",
        extra_env=dict(env),
        wrapper=["setpriv", f"--regid={cut_gid}", "--clear-groups"],
    )
    others = [
        WorkerProc("127.0.0.1:1", ns, tmp_path / n, tmp_path / f"{n}.log", extra_env=dict(env))
        for n in ("w2", "w3")
    ]
    workers = [cut, *others]
    reads = Reads()
    rule_added = False
    reader: asyncio.Task[None] | None = None
    appending: asyncio.Task[None] | None = None
    appended = asyncio.Event()
    watching: asyncio.Task[None] | None = None
    try:
        for w in workers:
            w.start()
        await wait_group_ready(workers, 8, stalled_s=120)
        appending = asyncio.create_task(_append(store, events[first:], appended))
        reader = asyncio.create_task(read_rounds(workers, keys, reads))
        while reads.answers < 3 * len(keys):  # a few rounds under load, all answering
            assert not reader.done(), reader
            await asyncio.sleep(0.2)
        _, before = await get(cut, "/status")
        held = set(before["partitions"])
        applying = Applying(workers)
        watching = asyncio.create_task(applying.run())

        await iptables("-A", cut_gid, AMQP_PORT)
        rule_added, cut_at = True, time.monotonic()
        unready_after: float | None = None
        reason = ""
        while time.monotonic() - cut_at < cut_s:
            status, body = await get(cut, "/readyz")
            if unready_after is None and status == 503 and body["unconfirmed"]:
                unready_after = time.monotonic() - cut_at
                reason = next(iter(body["unconfirmed"].values()))
            _, now = await get(cut, "/status")
            assert set(now["partitions"]) <= held, (held, now["partitions"])  # took nothing
            await asyncio.sleep(0.25)
        assert unready_after is not None, "the cut-off member stayed ready"
        assert unready_after <= LEASE_S + 1.0, (unready_after, reason)
        assert "not confirmed by the group" in reason, reason
        await iptables("-D", cut_gid, AMQP_PORT)
        rule_added = False

        await wait_group_ready(workers, 8, stalled_s=120)
        await appended.wait()
        applying.stop = True
        await watching
        # the group kept every partition applying: the broker moved the queue of a
        # partition given to another member once it dropped the cut-off connection
        # (amqp_heartbeat_s), while the events for it kept coming
        name, gap = applying.longest()
        assert gap <= MAX_GAP_S, (name, gap, applying.phases.get(name), applying.gaps)
        await _drained(services.amqp, ns, store, len(events), 180)
        reads.stop = True
        await reader
        await _read_exact(workers, expected)

        assert not reads.older, (
            f"{len(reads.older)} answers older than one already served, e.g. {reads.older[:5]}"
        )
        assert "takes none of" in cut.log_text(), cut.log_text()[-3000:]
        assert reads.unavailable.get(cut.port, 0) > 0  # it said so, rather than answer
        for w in workers:
            assert w.stop() == 0
        print(
            f"answers {reads.answers}, older 0; 503s by port {reads.unavailable}; the cut-off "
            f"member unready {unready_after:.1f}s after the cut; longest a partition applied "
            f"nothing: {gap:.1f}s ({name})"
        )
    except BaseException:
        print_logs(workers)
        raise
    finally:
        forwarder.kill()
        heal(cut_gid, AMQP_PORT, rule_added, reads, (reader, appending, watching), workers)
