"""Benchmark: table view lookups, answered locally and forwarded to the owner.

Two ``streamapp worker`` processes of the orders app on Kafka (8 partitions, 1,000
orders projected, a fresh namespace). Each key is classified once by asking worker A
(owned by A, else by B). The load comes from ``wrk`` (Debian's package;
``scripts/bench`` installs it), a compiled client, so that the client is not what is
measured: one wrk thread, ``--concurrency`` keep-alive connections, ``--seconds`` a run,
cycling through the keys of the mode with a Lua script (``bench/views.lua``) that prints
wrk's latency percentiles and requests/s. ``local``: a worker asked for the keys it
owns; ``forwarded``: asked for the other worker's keys (it asks the owner); ``aiohttp
bare``: the ceiling, a bare aiohttp server on the same event loop answering one fixed
body (``bench/views_ceiling.py``), asked for the local keys' paths in each round right
after the workers. Rounds alternate the asked worker (A, then B) and the order of the
modes; the table shows the median of the rounds against the issue's goals
(:func:`report.views_goal`). Every value is checked before and after the runs (200, the
expected value, forwarded or not as the mode says) and a run with any error (a non-2xx
answer, a socket error, a timeout) stops the bench. Beside the latencies: the CPU time
per request of the workers (``/proc``; ``local``: the asked worker's, ``forwarded``:
both workers'), steadier than a rate on a shared machine, and worker A's CPU with no
lookups (its own background work). The load average is recorded before and after. Not a
test: nothing asserts a timing.

    .venv/bin/python bench/views.py [--seconds 3] [--rounds 3] [--concurrency 1,8]
                                    [--event-loop asyncio|uvloop] [--profile out.txt]

``--profile OUT`` records the asked worker with ``py-spy`` (``.venv/bin/py-spy``, raw
folded stacks) during one more local run at the highest concurrency, after the rounds.
Kafka at ``STREAMAPP_KAFKA_BOOTSTRAP`` (default 127.0.0.1:9092).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402

from tests.integration.harness import (  # noqa: E402
    WorkerProc,
    create_topics,
    order_events,
    produce,
    wait_caught_up,
    wait_group_ready,
)

ORDERS = 1000
LUA = ROOT / "bench" / "views.lua"
MODES = ("local", "forwarded")
CEILING = "aiohttp bare"
"""The mode of bench/views_ceiling.py: a bare aiohttp server on the same loop, the ceiling."""
IDLE_S = 3.0
"""How long a worker's CPU is measured with no lookups (its own background work)."""
WRK_TIMEOUT_S = 2


def wrk_path() -> str:
    """The wrk binary, or exit naming the package that provides it."""
    found = shutil.which("wrk")
    if found is None:
        raise SystemExit(
            "wrk not found: the views bench needs Debian's wrk as its load generator "
            "(apt-get install wrk; scripts/bench installs it when run as root)"
        )
    return found


def parse_wrk(stdout: str) -> dict[str, Any]:
    """The figures ``views.lua`` printed (its ``wrk-json`` line)."""
    for line in stdout.splitlines():
        if line.startswith("wrk-json "):
            figures: dict[str, Any] = json.loads(line.removeprefix("wrk-json "))
            return figures
    raise SystemExit(f"wrk printed no figures (is bench/views.lua its script?):\n{stdout}")


def cpu_s(pid: int) -> float:
    """CPU time (user + system) process ``pid`` used so far, from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(
    url: str, paths: Path, concurrency: int, seconds: float, pids: tuple[int, ...] = ()
) -> dict[str, Any]:
    """One wrk run against ``url`` over the paths in ``paths``: its figures, with the CPU
    time per request of each process of ``pids`` (the workers: µs, ``cpu_us``); exits on
    any error (a non-2xx answer, a socket error or a timeout)."""
    cmd = [
        wrk_path(),
        "-t1",
        f"-c{concurrency}",
        f"-d{seconds:g}s",
        f"--timeout={WRK_TIMEOUT_S}s",
        "-s",
        str(LUA),
        url,
        "--",
        str(paths),
    ]
    cpu = [cpu_s(pid) for pid in pids]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30, check=False)
    cpu = [cpu_s(pid) - before for pid, before in zip(pids, cpu, strict=True)]
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    figures = parse_wrk(done.stdout)
    errors = {k: v for k, v in figures["errors"].items() if v}
    if errors or figures["requests"] == 0:
        raise SystemExit(f"{url} c={concurrency}: errors {errors}\n{done.stdout}")
    figures["cpu_us"] = [round(c / figures["requests"] * 1e6, 1) for c in cpu]
    return figures


async def check_values(
    http: aiohttp.ClientSession,
    asks: list[tuple[int, str, bool]],
    expected: dict[str, tuple[int, str]],
) -> None:
    """Each (port, key, forwarded) answers 200 with the key's expected value, forwarded
    to the owner or not as said."""
    for port, key, forwarded in asks:
        async with http.get(f"http://127.0.0.1:{port}/tables/order_status/{key}") as r:
            value = await r.json()
            got = (r.status, "X-Streamapp-Forwarded-To" in r.headers)
            if got != (200, forwarded) or (value["version"], value["status"]) != expected[key]:
                raise SystemExit(
                    f"{key} from {port}: {r.status} forwarded={got[1]} {value}, "
                    f"want {expected[key]} forwarded={forwarded}"
                )


def free_port() -> int:
    """A TCP port on 127.0.0.1 free now (for the ceiling server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def until_answers(port: int, key: str) -> None:
    """Until the ceiling server answers (bounded: 300 tries, 0.1 s apart)."""
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(f"http://127.0.0.1:{port}/tables/order_status/{key}") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"bench/views_ceiling.py never answered on port {port}")


def summary(results: dict[tuple[str, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per mode and concurrency: the medians of the rounds."""
    out = []
    for (mode, conc), runs in results.items():
        out.append(
            {
                "mode": mode,
                "concurrency": conc,
                "p50_ms": statistics.median(r["p50_ms"] for r in runs),
                "p90_ms": statistics.median(r["p90_ms"] for r in runs),
                "p99_ms": statistics.median(r["p99_ms"] for r in runs),
                "rps": statistics.median(r["rps"] for r in runs),
                # local: the asked worker's alone; forwarded: both workers'
                "cpu_us": statistics.median(
                    r["cpu_us"][0] if mode != "forwarded" else sum(r["cpu_us"]) for r in runs
                ),
                "rounds": [
                    {k: r[k] for k in ("worker", "p50_ms", "p90_ms", "p99_ms", "rps", "cpu_us")}
                    for r in runs
                ],
            }
        )
    return out


def profile(pid: int, out: Path, run: Any) -> None:
    """``run()`` while py-spy records process ``pid`` into ``out`` (raw folded stacks)."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy not found (scripts/bootstrap dev,bench installs it)")
    rec = subprocess.Popen(
        [spy, "record", "-o", str(out), "-f", "raw", "-r", "250", "--pid", str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        run()
    finally:
        rec.send_signal(2)  # SIGINT: py-spy writes what it recorded and exits
        rec.wait(timeout=60)
    print(f"py-spy profile of pid {pid}: {out}", flush=True)


async def main(args: argparse.Namespace) -> None:
    wrk_path()
    bootstrap = os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    ns = f"bviews{uuid.uuid4().hex[:6]}-"
    topic = f"{ns}orders"
    create_topics(bootstrap, ns)
    events, expected = order_events(ORDERS, ORDERS * 3)
    await produce(bootstrap, topic, events)
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    loads: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-views-") as tmp:
        env = {"STREAMAPP_EVENT_LOOP": args.event_loop}
        a, b = (
            WorkerProc(bootstrap, ns, Path(tmp) / n, Path(tmp) / f"{n}.log", extra_env=dict(env))
            for n in "ab"
        )
        workers = [a.start()]
        ceiling: subprocess.Popen[bytes] | None = None
        try:
            while await a.status() is None:  # a makes the SQLite event store, then b starts
                assert a.alive, a.log_text()[-2000:]
                await asyncio.sleep(0.2)
            workers.append(b.start())
            await wait_group_ready(workers, 8)
            await wait_caught_up(bootstrap, topic, topic, 120, workers)
            await wait_group_ready(workers, 8)
            keys = sorted(expected)
            owner_port: dict[str, int] = {}
            async with aiohttp.ClientSession() as http:
                for key in keys:
                    async with http.get(
                        f"http://127.0.0.1:{a.port}/tables/order_status/{key}"
                    ) as r:
                        await r.read()
                        assert r.status == 200, (key, r.status)
                        owner_port[key] = (
                            b.port if "X-Streamapp-Forwarded-To" in r.headers else a.port
                        )
                other = {a.port: b.port, b.port: a.port}
                asks = [(owner_port[k], k, False) for k in keys] + [
                    (other[owner_port[k]], k, True) for k in keys
                ]
                await check_values(http, asks, expected)
                async with http.get(
                    f"http://127.0.0.1:{a.port}/tables/order_status/{keys[0]}"
                ) as r:
                    body = await r.text()
            ceiling_port = free_port()
            ceiling = subprocess.Popen(  # noqa: ASYNC220 (started once, before the runs)
                [
                    sys.executable,
                    str(ROOT / "bench" / "views_ceiling.py"),
                    "--port",
                    str(ceiling_port),
                    "--body",
                    body,
                    "--event-loop",
                    args.event_loop,
                ]
            )
            await until_answers(ceiling_port, keys[0])
            on_a = sum(1 for k in keys if owner_port[k] == a.port)
            print(f"{ns}: {on_a} keys on A, {len(keys) - on_a} on B", flush=True)
            # the paths each worker is asked in each mode
            paths: dict[tuple[int, str], Path] = {}
            for port in (a.port, b.port):
                for mode in MODES:
                    mine = [k for k in keys if (owner_port[k] == port) == (mode == "local")]
                    paths[port, mode] = Path(tmp) / f"{port}-{mode}.paths"
                    paths[port, mode].write_text(
                        "".join(f"/tables/order_status/{k}\n" for k in mine)
                    )
            top = max(args.concurrency)
            for port in (a.port, b.port):  # warm-up: connections, caches
                for mode in MODES:
                    wrk(f"http://127.0.0.1:{port}", paths[port, mode], top, 1)
            wrk(f"http://127.0.0.1:{ceiling_port}", paths[a.port, "local"], top, 1)
            assert a.proc is not None
            idle = cpu_s(a.proc.pid)
            await asyncio.sleep(IDLE_S)
            idle = (cpu_s(a.proc.pid) - idle) / IDLE_S
            print(f"worker A idle: {idle:.1%} of a core", flush=True)
            loads["before"] = [round(x, 2) for x in os.getloadavg()]
            for rnd in range(args.rounds):
                asked, owner = (a, b) if rnd % 2 == 0 else (b, a)
                name = "A" if asked is a else "B"
                url = f"http://127.0.0.1:{asked.port}"
                pids = tuple(w.proc.pid for w in (asked, owner) if w.proc is not None)
                for conc in args.concurrency:
                    for mode in MODES if rnd % 2 == 0 else tuple(reversed(MODES)):
                        fig = wrk(url, paths[asked.port, mode], conc, args.seconds, pids)
                        fig["worker"] = name
                        results.setdefault((mode, conc), []).append(fig)
                        print(
                            f"round {rnd + 1} {name} {mode:9} c={conc}: p50 {fig['p50_ms']:.3f} "
                            f"ms, p99 {fig['p99_ms']:.3f} ms, {fig['rps']:,.0f} req/s, "
                            f"CPU per request {' + '.join(f'{c:.0f}' for c in fig['cpu_us'])} µs "
                            "(asked + owner)",
                            flush=True,
                        )
                    fig = wrk(
                        f"http://127.0.0.1:{ceiling_port}",
                        paths[asked.port, "local"],
                        conc,
                        args.seconds,
                        (ceiling.pid,),
                    )
                    fig["worker"] = CEILING
                    results.setdefault((CEILING, conc), []).append(fig)
                    print(
                        f"round {rnd + 1} {CEILING} c={conc}: p50 {fig['p50_ms']:.3f} ms, "
                        f"p99 {fig['p99_ms']:.3f} ms, {fig['rps']:,.0f} req/s, "
                        f"CPU per request {fig['cpu_us'][0]:.0f} µs",
                        flush=True,
                    )
            loads["after"] = [round(x, 2) for x in os.getloadavg()]
            if args.profile is not None:
                assert a.proc is not None
                url = f"http://127.0.0.1:{a.port}"
                path = paths[a.port, "local"]
                profile(a.proc.pid, args.profile, lambda: wrk(url, path, top, args.seconds))
            async with aiohttp.ClientSession() as http:
                await check_values(http, asks, expected)
            for w in workers:
                assert w.alive, w.log_text()[-2000:]
        finally:
            if ceiling is not None:
                ceiling.terminate()
                ceiling.wait(timeout=30)
            for w in workers:
                if w.alive:
                    w.stop()
    figures = summary(results)
    print()
    print(
        f"views: wrk, {args.seconds:g} s a run, median of {args.rounds} rounds, 2 workers "
        f"({args.event_loop}), "
        f"8 partitions, 1,000 orders; load average before {loads['before']}, "
        f"after {loads['after']}"
    )
    print(
        f"{'mode':10} {'conc':>4} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'req/s':>9} "
        f"{'CPU µs':>7}  goal"
    )
    for f in figures:
        goal, met = report.views_goal(f)
        verdict = "" if met is None else ("met" if met else "NOT met")
        print(
            f"{f['mode']:10} {f['concurrency']:>4} {f['p50_ms']:>8.3f} {f['p90_ms']:>8.3f} "
            f"{f['p99_ms']:>8.3f} "
            f"{f['rps']:>9,.0f} {f['cpu_us']:>7.0f}  {goal} {verdict}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "client": "wrk",
                    "event_loop": args.event_loop,
                    "seconds": args.seconds,
                    "rounds": args.rounds,
                    "loadavg": loads,
                    "idle_cpu": round(idle, 4),
                    "runs": figures,
                }
            )
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of a wrk run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 8],
        help="comma-separated concurrencies (default 1,8)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--event-loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the workers' setting event_loop (default asyncio)",
    )
    parser.add_argument(
        "--profile", type=Path, default=None, help="py-spy raw stacks of worker A to this file"
    )
    asyncio.run(main(parser.parse_args()))
