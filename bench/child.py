"""One contender run in a child process, with the CPU time it spent (``os.wait4``).

Every contender of bench/harness.py runs so: nothing one run leaves behind slows the next,
and the child's own resource usage (user + system, all its threads) gives its CPU time per
event, a figure that moves far less with machine load than a rate does.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass
class RunResult:
    """One run of one contender; ``rate`` None when it failed (``problem`` says why)."""

    rate: float | None
    problem: str | None = None
    events: int = 0
    """Events the run processed (the denominator of ``cpu_us_per_event``)."""
    cpu_s: float | None = None
    """The child's user + system CPU time, start-up and shutdown included (wait4)."""
    span_cpu_s: float | None = None
    """The child's CPU time over the timed span only (its own getrusage, threads too)."""
    span_events: int | None = None
    wall_s: float | None = None
    load_1m: float | None = None
    """The machine's 1-minute load average just before the run."""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def cpu_us_per_event(self) -> float | None:
        return per_event(self.cpu_s, self.events)

    @property
    def span_cpu_us_per_event(self) -> float | None:
        return per_event(self.span_cpu_s, self.span_events or 0)


def per_event(cpu_s: float | None, events: int) -> float | None:
    """µs per event, or None without a CPU figure or events."""
    return round(cpu_s * 1e6 / events, 2) if cpu_s is not None and events > 0 else None


@dataclasses.dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str
    cpu_s: float
    wall_s: float
    timed_out: bool


def run(cmd: Sequence[str], timeout_s: float) -> Finished:
    """Run ``cmd`` to its end (killed past ``timeout_s``); its output and rusage.

    The child is reaped with ``os.wait4``, whose rusage is the child's own (its threads
    included), not the harness's: ``subprocess.run`` would reap it and lose that."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        timed_out = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - started > timeout_s:
                timed_out = True
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.02)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        return Finished(
            returncode=proc.returncode,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
            cpu_s=usage.ru_utime + usage.ru_stime,
            wall_s=wall,
            timed_out=timed_out,
        )


def contender(cmd: Sequence[str], timeout_s: float, events: int, hint: str = "") -> RunResult:
    """Run one contender over ``events`` events; it prints one JSON line (rate, exact,
    note, span_cpu_s, span_events, and figures of its own, kept in ``extra``)."""
    load = os.getloadavg()[0]
    done = run(cmd, timeout_s)
    base: dict[str, Any] = {
        "cpu_s": round(done.cpu_s, 3),
        "wall_s": round(done.wall_s, 2),
        "load_1m": round(load, 2),
    }
    if done.timed_out:
        return RunResult(None, f"timed out after {timeout_s:.0f} s", **base)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = [x for x in done.stderr.strip().splitlines() if "Got error" not in x]
        return RunResult(None, f"failed: {(tail or ['no output'])[-1][:300]}{hint}", **base)
    out: dict[str, Any] = json.loads(lines[-1])
    problem = None if out.get("exact") else f"final state not exact: {out.get('note')}"
    known = {"rate", "exact", "note", "events", "span_cpu_s", "span_events"}
    return RunResult(
        float(out["rate"]),
        problem,
        events=events,
        span_cpu_s=out.get("span_cpu_s"),
        span_events=out.get("span_events"),
        extra={k: v for k, v in out.items() if k not in known},
        **base,
    )
