"""The one-command benchmark (``scripts/bench``, ``make bench``): every figure, one report.

Throughput: two workloads of order CloudEvents on a fresh 8-partition topic each,

- 100k events over 1,000 orders, the rivals in their exactly-once modes (and Quix in
  its default at-least-once mode too);
- 100k events over 10,000 orders, the rivals at their defaults (at-least-once; Bytewax
  with recovery off, and on with snapshots every second), and Quix exactly-once too,

so that streamapp meets Quix in both of its modes on both workloads,

and the order_status projection in each contender (raw aiokafka, streamapp, Quix
Streams, faust-streaming, Bytewax), in rounds that alternate the contenders (the order
rotates every round), on the same data; the report gives medians and ratios to raw
aiokafka and of streamapp to each. Every contender's final state (streamapp's too) is
checked per order (``rivals.check``: each order's version equals its event count).

Then, each in its own process: live latency at a fixed 2,000 events/s (publish to view,
``bench/latency.py``), catch-up replay from SQLite (``bench/replay.py``), changelog
restore (``bench/restore.py``), the RabbitMQ-fed projection against raw aio-pika
(``bench/rabbitmq.py``), view lookups local and forwarded (``bench/views.py``) and v1's
live latency while v2 of its table replays 1M stored events, against v1 alone, with the
building lane's replay rate (``bench/versions_latency.py``). A part
that cannot run is reported "n/a" with the reason.

Writes ``bench/results/<YYYY-MM-DD>.json`` and ``.png`` (events/s per contender and
workload) and prints the tables. ``--quick`` is a smoke run (a few thousand events, one
round; files named ``<date>-quick``). Not a test: nothing asserts a timing.

    scripts/bench [--quick] [--rounds 3] [--events 100000] [--parts throughput,latency,...]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402
from orders_projection import produce, rival  # noqa: E402

PARTS = ("throughput", "latency", "replay", "restore", "rabbitmq", "views", "versions")


@dataclasses.dataclass(frozen=True)
class Contender:
    """One column of the race: ``kind`` says how it runs, ``flags`` go to rivals.py."""

    name: str
    kind: str  # raw | streamapp | quix | faust | bytewax
    flags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Workload:
    key: str
    title: str
    orders: int
    contenders: tuple[Contender, ...]


RAW = Contender("raw aiokafka", "raw")
STREAMAPP = Contender("streamapp", "streamapp")
WORKLOADS = (
    Workload(
        "1k-orders-exactly-once",
        "1,000 orders (each rival's mode in its name)",
        1_000,
        (
            RAW,
            STREAMAPP,
            Contender("Quix exactly-once", "quix", ("--exactly-once",)),
            Contender("Quix at-least-once", "quix"),
            Contender("faust exactly-once", "faust", ("--exactly-once",)),
        ),
    ),
    Workload(
        "10k-orders-defaults",
        "10,000 orders (each rival's mode in its name)",
        10_000,
        (
            RAW,
            STREAMAPP,
            Contender("Quix at-least-once", "quix"),
            Contender("Quix exactly-once", "quix", ("--exactly-once",)),
            Contender("faust at-least-once", "faust"),
            Contender("Bytewax recovery off", "bytewax"),
            Contender("Bytewax recovery 1 s", "bytewax", ("--recovery",)),
            Contender("streamapp dict data", "streamapp-dict"),
            Contender("streamapp typed data", "streamapp-typed"),
        ),
    ),
)


async def throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Rounds over both workloads; per contender its rates, median and ratios."""
    topics = {}
    for w in WORKLOADS:
        topics[w.key] = f"bench-{w.orders}-{uuid.uuid4().hex[:8]}"
        print(f"producing {args.events:,} events over {w.orders:,} orders to {topics[w.key]}")
        await produce(args.bootstrap, topics[w.key], args.events, w.orders)
    rates: dict[str, dict[str, list[float]]] = {w.key: {} for w in WORKLOADS}
    problems: dict[str, dict[str, str]] = {w.key: {} for w in WORKLOADS}
    for r in range(args.rounds):
        for w in WORKLOADS:
            order = w.contenders[r % len(w.contenders) :] + w.contenders[: r % len(w.contenders)]
            for c in order:
                rate, problem = await run_contender(c, args, topics[w.key], w.orders)
                if problem:
                    problems[w.key][c.name] = problem
                if rate is not None:
                    rates[w.key].setdefault(c.name, []).append(rate)
                shown = f"{rate:,.0f} ev/s" if rate is not None else f"n/a ({problem})"
                print(f"round {r + 1} {w.key:<24} {c.name:<22} {shown}", flush=True)
    return {
        w.key: {
            "title": w.title,
            "events": args.events,
            "orders": w.orders,
            "faust_events": min(args.events, args.faust_events),
            "contenders": summarise(w.contenders, rates[w.key], problems[w.key]),
        }
        for w in WORKLOADS
    }


def summarise(
    contenders: tuple[Contender, ...], rates: dict[str, list[float]], problems: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Per contender: its rates by round, their median, the median over raw aiokafka's and
    streamapp's median over it (None where a side has no run)."""
    med = {name: statistics.median(v) for name, v in rates.items() if v}
    raw, mine = med.get(RAW.name), med.get(STREAMAPP.name)
    return {
        c.name: {
            "rates": [round(x, 1) for x in rates.get(c.name, [])],
            "median": round(med[c.name], 1) if c.name in med else None,
            "over_raw": ratio(med.get(c.name), raw),
            "streamapp_over_it": ratio(mine, med.get(c.name)),
            "problem": problems.get(c.name),
        }
        for c in contenders
    }


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` to 3 places; None when either is missing (or ``b`` is 0)."""
    return round(a / b, 3) if a is not None and b else None


async def run_contender(
    c: Contender, args: argparse.Namespace, topic: str, orders: int
) -> tuple[float | None, str | None]:
    """(events/s, problem) of one run of ``c`` over ``topic``, in a fresh process (as every
    contender: nothing one run leaves behind slows the next)."""
    if c.kind in ("raw", "streamapp", "streamapp-dict", "streamapp-typed"):
        return await asyncio.to_thread(ours, c.kind, args.bootstrap, topic, args.events, orders)
    n = min(args.events, args.faust_events) if c.kind == "faust" else args.events
    return await asyncio.to_thread(
        rival, c.kind, args.bootstrap, topic, n, orders, c.flags, args.rival_timeout, args.events
    )


def ours(
    kind: str, bootstrap: str, topic: str, events: int, orders: int
) -> tuple[float | None, str | None]:
    """raw aiokafka or streamapp, run by bench/orders_projection.py --one (streamapp's
    final state checked per order, as every rival's)."""
    cmd = [sys.executable, str(ROOT / "bench" / "orders_projection.py"), "--one", kind]
    cmd += ["--bootstrap", bootstrap, "--topic", topic, "--events", str(events)]
    cmd += ["--orders", str(orders)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        return None, "timed out after 300 s"
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = [x for x in done.stderr.strip().splitlines() if "Got error" not in x]
        return None, f"failed: {(tail or ['no output'])[-1][:300]}"
    return float(json.loads(lines[-1])["rate"]), None


def run_part(script: str, options: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``bench/<script>`` with ``--json``; its figures, or ``{"n/a": reason}``."""
    with tempfile.TemporaryDirectory(prefix="bench-part-") as tmp:
        path = Path(tmp) / "out.json"
        cmd = [sys.executable, str(ROOT / "bench" / script), *options, "--json", str(path)]
        print(f"$ {' '.join(cmd[1:-2])}", flush=True)
        started = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"n/a": f"{script} timed out after {timeout_s:.0f} s"}
        took = time.perf_counter() - started
        if done.returncode != 0 or not path.exists():
            lines = [x for x in done.stderr.strip().splitlines() if "Got error" not in x]
            return {"n/a": f"{script} failed: {(lines or ['no output'])[-1][:300]}"}
        print("\n".join(done.stdout.strip().splitlines()[-6:]), flush=True)
        figures: dict[str, Any] = json.loads(path.read_text())
        figures["wall_s"] = round(took, 1)
        return figures


def other_parts(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Latency, replay, restore, RabbitMQ and views, each in its own process."""
    q = args.quick
    rounds = "1" if q else "3"
    plans: dict[str, tuple[str, list[str]]] = {
        "latency": ("latency.py", ["--rate", "2000", "--seconds", "3" if q else "20"]),
        "replay": (
            "replay.py",
            ["--stores", "sqlite", "--events", "5000" if q else str(args.replay_events)],
        ),
        "restore": ("restore.py", ["--events", str(args.events), "--orders", "10000"]),
        "rabbitmq": (
            "rabbitmq.py",
            ["--events", "2000" if q else "20000", "--publish", "200" if q else "1000"],
        ),
        "views": (
            "views.py",
            ["--requests", "200" if q else "2000", "--concurrency", "1" if q else "1,8"],
        ),
        "versions": (
            "versions_latency.py",
            ["--events", "20000" if q else "1000000", "--seconds", "3" if q else "20"],
        ),
    }
    out: dict[str, dict[str, Any]] = {}
    for part, (script, options) in plans.items():
        if part not in args.parts:
            out[part] = {"n/a": "not run (--parts)"}
            continue
        if part == "rabbitmq" and not os.environ.get("STREAMAPP_AMQP_URL"):
            out[part] = {"n/a": "no RabbitMQ (STREAMAPP_AMQP_URL unset)"}
            continue
        if part not in ("latency", "versions"):
            options = [*options, "--rounds", rounds]
        # versions fills a 1M-event store once and replays it twice: its own bound
        timeout = max(args.part_timeout, 1800.0) if part == "versions" else args.part_timeout
        out[part] = run_part(script, options, timeout)
    return out


def machine() -> dict[str, Any]:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False)
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "uptime": uptime.stdout.strip(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "kafka": kafka_version(),
        "packages": {p: package_version(p) for p in report.PACKAGES},
    }


def kafka_version() -> str:
    pom = (ROOT / "scripts" / "kafka" / "pom.xml").read_text()
    start = pom.index("<kafka.version>") + len("<kafka.version>")
    return f"Apache Kafka {pom[start : pom.index('<', start)]} (KRaft, one node, scripts/services)"


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: few events, 1 round")
    parser.add_argument("--events", type=int, default=None, help="per workload (100,000)")
    parser.add_argument("--rounds", type=int, default=None, help="throughput rounds (3)")
    parser.add_argument("--faust-events", type=int, default=None, help="faust reads (20,000)")
    parser.add_argument("--replay-events", type=int, default=300_000)
    parser.add_argument("--parts", default=",".join(PARTS), help="comma list of " + ",".join(PARTS))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--rival-timeout", type=float, default=300.0, help="s per rival run")
    parser.add_argument("--part-timeout", type=float, default=300.0, help="s per other part")
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    args = parser.parse_args()
    args.events = args.events or (3_000 if args.quick else 100_000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.faust_events = args.faust_events or (1_000 if args.quick else 20_000)
    args.parts = [p for p in args.parts.split(",") if p]
    if unknown := set(args.parts) - set(PARTS):
        parser.error(f"unknown --parts {sorted(unknown)}; choose from {','.join(PARTS)}")

    started = time.time()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "quick": args.quick,
        "rounds": args.rounds,
        "machine_before": machine(),
    }
    if "throughput" in args.parts:
        results["throughput"] = await throughput(args)
    results.update(other_parts(args))
    results["machine_after"] = {"uptime": machine()["uptime"], "loadavg": os.getloadavg()}
    results["wall_s"] = round(time.time() - started, 1)

    args.out.mkdir(parents=True, exist_ok=True)
    stem = results["date"] + ("-quick" if args.quick else "")
    json_path, png_path = args.out / f"{stem}.json", args.out / f"{stem}.png"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    if "throughput" in results:
        report.chart(results, png_path)
    print()
    print(report.tables(results))
    print(f"\nwritten: {json_path}" + (f", {png_path}" if png_path.exists() else ""))


if __name__ == "__main__":
    asyncio.run(main())
