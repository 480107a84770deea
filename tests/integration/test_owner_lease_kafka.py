"""A worker cut off from Kafka stops answering as owner, and does not fence the rightful
owners when it comes back (issue 33).

Three workers of the reference app under a modest load; every key is read from every
worker in rounds. One worker runs with its own group id (a system group; its uid stays
root's, as the test's interpreter lives under /root, which no other uid may read), and
iptables drops its packets to Kafka's port (owner match on that gid; its HTTP port still
answers) for ~15 s, then lets them through again.
Every answer is checked against the answers already served for its key: none may be
older (a lower event count) than one served before it was asked.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from .cutoff import (
    KAFKA_PORT,
    Reads,
    cut_group,
    get,
    heal,
    iptables,
    print_logs,
    read_rounds,
)
from .harness import (
    WorkerProc,
    around_traceback,
    assert_exact,
    create_topics,
    order_events,
    produce,
    read_table,
    wait_caught_up,
    wait_group_ready,
)

# serial: it changes the machine's firewall (run alone)
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.serial]

CUT_S = 15.0  # past the session timeout (6 s) and the move: long enough to see both
RATE = 150.0
SESSION_TIMEOUT_S = 6.0
LEASE_S = SESSION_TIMEOUT_S * 2 / 3  # the default owner_lease_s


@pytest.mark.timeout(420)
async def test_a_worker_cut_off_from_kafka_stops_answering_as_owner_and_fences_nobody(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    assert os.geteuid() == 0, "iptables and another group id need root"
    cut_gid = cut_group()
    ns = f"lease{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=300, n_events=int(RATE * (CUT_S + 20)))
    keys = sorted(expected)
    env = {
        "STREAMAPP_SESSION_TIMEOUT_MS": str(int(SESSION_TIMEOUT_S * 1000)),
        "STREAMAPP_POLL_TIMEOUT_MS": "200",
    }
    cut = WorkerProc(
        kafka_bootstrap,
        ns,
        tmp_path / "cut",
        tmp_path / "cut.log",
        # its transactions fail fast while it is cut off, so that its writer is being
        # started again (which would fence the rightful owner) when the network returns
        extra_env={**env, "STREAMAPP_TRANSACTION_TIMEOUT_S": "4"},
        wrapper=["setpriv", f"--regid={cut_gid}", "--clear-groups"],
    )
    others = [
        WorkerProc(kafka_bootstrap, ns, tmp_path / n, tmp_path / f"{n}.log", extra_env=dict(env))
        for n in ("w2", "w3")
    ]
    workers = [cut, *others]
    reads = Reads()
    rule_added = False
    reader: asyncio.Task[None] | None = None
    producing: asyncio.Task[None] | None = None
    try:
        for w in workers:
            w.start()
        await wait_group_ready(workers, 8, stalled_s=120)
        producing = asyncio.create_task(produce(kafka_bootstrap, f"{ns}orders", events, rate=RATE))
        reader = asyncio.create_task(read_rounds(workers, keys, reads))
        while reads.answers < 3 * len(keys):  # a few rounds under load, all answering
            assert not reader.done(), reader
            assert not producing.done(), producing
            await asyncio.sleep(0.2)

        await iptables("-A", cut_gid)
        rule_added, cut_at = True, time.monotonic()
        unready_after: float | None = None
        reason = ""
        while unready_after is None and time.monotonic() - cut_at < CUT_S:
            status, body = await get(cut, "/readyz")
            if status == 503 and body["unconfirmed"]:
                unready_after = time.monotonic() - cut_at
                reason = next(iter(body["unconfirmed"].values()))
            await asyncio.sleep(0.2)
        assert unready_after is not None, "the cut-off worker stayed ready"
        assert unready_after <= LEASE_S + 1.0, (unready_after, reason)
        assert "not confirmed by the group" in reason, reason
        _, status_body = await get(cut, "/status")
        phases = {p["phase"] for p in status_body["partitions"].values()}
        assert phases <= {"unconfirmed"}, status_body["partitions"]
        # the group moves the cut-off worker's partitions to the two others
        await wait_group_ready(others, 8, stalled_s=CUT_S)
        moved_after = time.monotonic() - cut_at
        await asyncio.sleep(max(CUT_S - moved_after, 0.0))
        healed_at = len(others[0].log_text()), len(others[1].log_text())
        await iptables("-D", cut_gid)
        rule_added = False

        await wait_group_ready(workers, 8, stalled_s=120)  # it rejoined the group
        await producing
        await wait_caught_up(kafka_bootstrap, ns + "orders", ns + "orders", 120, workers)
        reads.stop = True
        await reader
        table = await read_table(workers, "order_status", keys)
        assert_exact(table, expected)

        assert not reads.older, (
            f"{len(reads.older)} answers older than one already served, e.g. {reads.older[:5]}"
        )
        for w, since in zip(others, healed_at, strict=True):
            assert "another worker took the partition over" not in w.log_text(), w.log_text()[
                since:
            ][-3000:]
        assert reads.unavailable.get(cut.port, 0) > 0  # it said so, rather than answer
        for w in workers:
            assert w.stop() == 0
        for w in others:
            assert "Traceback" not in w.log_text(), around_traceback(w.log_text())
        print(
            f"answers {reads.answers}, older 0; 503s by port {reads.unavailable}; the cut-off "
            f"worker unready {unready_after:.1f}s after the cut; the others owned all 8 "
            f"partitions {moved_after:.1f}s after it"
        )
    except BaseException:
        print_logs(workers)
        raise
    finally:
        heal(cut_gid, KAFKA_PORT, rule_added, reads, (reader, producing), workers)
