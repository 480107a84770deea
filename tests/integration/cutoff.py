"""A worker cut off from its broker by the firewall, and reads judged while it is.

The cut-off worker runs with its own group id (:func:`cut_group`; its uid stays root's,
as the tests' interpreter lives under /root, which no other uid may read), and iptables
drops that group's packets to the broker's port (an owner match), so that its HTTP port
still answers. :func:`read_rounds` reads every key from every worker, round after round,
and judges each answer against those already served for its key.
"""

from __future__ import annotations

import asyncio
import grp
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .harness import WorkerProc

CUT_GROUP = "streamapp-cut"
KAFKA_PORT = "9092"


def cut_group() -> int:
    """The group id a cut-off worker runs with: a system group, made when missing."""
    try:
        return grp.getgrnam(CUT_GROUP).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "-r", CUT_GROUP], check=True, timeout=30)
        return grp.getgrnam(CUT_GROUP).gr_gid


async def iptables(action: str, gid: int, port: str = KAFKA_PORT) -> None:
    """Add (``-A``) or delete (``-D``) the rule dropping ``gid``'s packets to ``port``."""
    proc = await asyncio.create_subprocess_exec(*rule(action, gid, port))
    assert await asyncio.wait_for(proc.wait(), 10) == 0, action


def rule(action: str, gid: int, port: str = KAFKA_PORT) -> list[str]:
    return [
        "iptables",
        action,
        "OUTPUT",
        "-p",
        "tcp",
        "--dport",
        port,
        "-m",
        "owner",
        "--gid-owner",
        str(gid),
        "-j",
        "DROP",
    ]


def print_logs(workers: list[WorkerProc]) -> None:
    """Each worker's log tail, printed when a cut-off test fails (the logs go with
    tmp_path)."""
    for w in workers:
        print(f"--- {w.log_path.name} ---\n{w.log_text()[-6000:]}")


def heal(
    gid: int,
    port: str,
    rule_added: bool,
    reads: Reads,
    tasks: tuple[asyncio.Task[None] | None, ...],
    workers: list[WorkerProc],
) -> None:
    """A cut-off test's teardown: the firewall rule deleted when still there, the reading
    rounds stopped, ``tasks`` cancelled when not done, every worker still running killed."""
    if rule_added:
        subprocess.run(rule("-D", gid, port), check=False, timeout=10)
    reads.stop = True
    for task in tasks:
        if task is not None and not task.done():
            task.cancel()
    for w in workers:
        if w.alive:
            w.kill()


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


async def read_rounds(workers: list[WorkerProc], keys: list[str], reads: Reads) -> None:
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


async def get(worker: WorkerProc, path: str) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http,
        http.get(f"http://127.0.0.1:{worker.port}{path}") as r,
    ):
        body: dict[str, Any] = await r.json()
        return r.status, body
