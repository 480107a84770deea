"""A worker cut off from Kafka stops answering as owner, and does not fence the rightful
owners when it comes back (issue 33).

Three workers of the reference app under a modest load; every key is read from every
worker in rounds. One worker runs with its own group id (a system group; its uid stays
root's, as the test's interpreter lives under /root, which no other uid may read), and
iptables drops its packets to Kafka's port (owner match on that gid; its HTTP port still
answers) for ~40 s, then lets them through again.
Every answer is checked against the answers already served for its key: none may be
older (a lower event count) than one served before it was asked.
"""

from __future__ import annotations

import asyncio
import grp
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from .harness import (
    WorkerProc,
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

CUT_GROUP = "streamapp-cut"
KAFKA_PORT = "9092"
CUT_S = 40.0
RATE = 150.0
SESSION_TIMEOUT_S = 10.0
LEASE_S = SESSION_TIMEOUT_S * 2 / 3  # the default owner_lease_s


@pytest.fixture
def cut_gid() -> int:
    """The group id the cut-off worker runs with: a system group, made when missing."""
    try:
        return grp.getgrnam(CUT_GROUP).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "-r", CUT_GROUP], check=True, timeout=30)
        return grp.getgrnam(CUT_GROUP).gr_gid


async def _iptables(action: str, gid: int) -> None:
    """Add (``-A``) or delete (``-D``) the rule dropping ``gid``'s packets to Kafka."""
    proc = await asyncio.create_subprocess_exec(*_rule(action, gid))
    assert await asyncio.wait_for(proc.wait(), 10) == 0, action


def _rule(action: str, gid: int) -> list[str]:
    return [
        "iptables",
        action,
        "OUTPUT",
        "-p",
        "tcp",
        "--dport",
        KAFKA_PORT,
        "-m",
        "owner",
        "--gid-owner",
        str(gid),
        "-j",
        "DROP",
    ]


@dataclass
class Reads:
    """Every answer of the reading rounds, judged against what was served before it."""

    served: dict[str, int] = field(default_factory=dict)
    """Per key, the highest event count answered so far (by any worker)."""
    older: list[tuple[str, int, int, int, float]] = field(default_factory=list)
    """(key, worker port, count answered, count served before, seconds after start)."""
    answers: int = 0
    unavailable: dict[int, int] = field(default_factory=dict)
    """503s per worker port."""
    stop: bool = False


async def _read_rounds(workers: list[WorkerProc], keys: list[str], reads: Reads) -> None:
    started = time.monotonic()
    sem = asyncio.Semaphore(24)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def ask(w: WorkerProc, key: str) -> None:
            async with sem:
                floor = reads.served.get(key, 0)  # served before this read began
                try:
                    async with http.get(
                        f"http://127.0.0.1:{w.port}/tables/order_status/{key}"
                    ) as r:
                        body = await r.json()
                        status = r.status
                except (TimeoutError, aiohttp.ClientError):
                    return
            if status == 503:
                reads.unavailable[w.port] = reads.unavailable.get(w.port, 0) + 1
                return
            if status != 200:
                return
            count = int(body["version"])
            reads.answers += 1
            if count < floor:
                reads.older.append((key, w.port, count, floor, time.monotonic() - started))
            reads.served[key] = max(reads.served.get(key, 0), count)

        while not reads.stop:
            await asyncio.gather(*(ask(w, k) for k in keys for w in workers))


async def _get(worker: WorkerProc, path: str) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http,
        http.get(f"http://127.0.0.1:{worker.port}{path}") as r,
    ):
        body: dict[str, Any] = await r.json()
        return r.status, body


@pytest.mark.timeout(420)
async def test_a_worker_cut_off_from_kafka_stops_answering_as_owner_and_fences_nobody(
    kafka_bootstrap: str, tmp_path: Path, cut_gid: int
) -> None:
    assert os.geteuid() == 0, "iptables and another group id need root"
    ns = f"lease{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns)
    events, expected = order_events(n_orders=300, n_events=int(RATE * 85))
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
        await wait_group_ready(workers, 8, within_s=120)
        producing = asyncio.create_task(produce(kafka_bootstrap, f"{ns}orders", events, rate=RATE))
        reader = asyncio.create_task(_read_rounds(workers, keys, reads))
        while reads.answers < 3 * len(keys):  # a few rounds under load, all answering
            assert not reader.done(), reader
            assert not producing.done(), producing
            await asyncio.sleep(0.2)

        await _iptables("-A", cut_gid)
        rule_added, cut_at = True, time.monotonic()
        unready_after: float | None = None
        reason = ""
        while unready_after is None and time.monotonic() - cut_at < CUT_S:
            status, body = await _get(cut, "/readyz")
            if status == 503 and body["unconfirmed"]:
                unready_after = time.monotonic() - cut_at
                reason = next(iter(body["unconfirmed"].values()))
            await asyncio.sleep(0.2)
        assert unready_after is not None, "the cut-off worker stayed ready"
        assert unready_after <= LEASE_S + 1.0, (unready_after, reason)
        assert "not confirmed by the group" in reason, reason
        _, status_body = await _get(cut, "/status")
        phases = {p["phase"] for p in status_body["partitions"].values()}
        assert phases <= {"unconfirmed"}, status_body["partitions"]
        # the group moves the cut-off worker's partitions to the two others
        await wait_group_ready(others, 8, within_s=CUT_S)
        moved_after = time.monotonic() - cut_at
        await asyncio.sleep(max(CUT_S - moved_after, 0.0))
        healed_at = len(others[0].log_text()), len(others[1].log_text())
        await _iptables("-D", cut_gid)
        rule_added = False

        await wait_group_ready(workers, 8, within_s=120)  # it rejoined the group
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
            assert "Traceback" not in w.log_text(), w.log_text()[-3000:]
        print(
            f"answers {reads.answers}, older 0; 503s by port {reads.unavailable}; the cut-off "
            f"worker unready {unready_after:.1f}s after the cut; the others owned all 8 "
            f"partitions {moved_after:.1f}s after it"
        )
    except BaseException:
        for w in workers:  # the logs go with tmp_path
            print(f"--- {w.log_path.name} ---\n{w.log_text()[-6000:]}")
        raise
    finally:
        if rule_added:
            subprocess.run(_rule("-D", cut_gid), check=False, timeout=10)  # noqa: ASYNC221
        reads.stop = True
        for task in (reader, producing):
            if task is not None and not task.done():
                task.cancel()
        for w in workers:
            if w.alive:
                w.kill()
