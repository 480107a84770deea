"""The one-command benchmark (``scripts/bench``, ``make bench``): every figure, one report.

Throughput: four workloads of order CloudEvents on a fresh 8-partition topic each, two key
counts (1,000 and 10,000 orders) times two payloads (``standard`` data of 51 bytes, about
240 bytes a record with its headers; ``1kb``, the same plus 13 order lines, about 1.2 KB):

- 1,000 orders, the rivals in their exactly-once modes (Quix at-least-once too);
- 10,000 orders, the rivals at their defaults (at-least-once; Bytewax with recovery off,
  and on with snapshots every second), and Quix exactly-once too;

(the 1 KB workloads with fewer rivals), the order_status projection in each contender, in
rounds that alternate the contenders (the order rotates every round), on the same data.
``streamapp traced`` is streamapp with OpenTelemetry tracing on, its spans dropped by an
exporter to nowhere (the otel extra): beside the ``streamapp`` row (tracing off), what
tracing costs.
The raw aiokafka consumer runs twice: ``raw-default`` (aiokafka's fetch defaults) and
``raw-tuned`` (``raw_consumer.TUNED``), the client's ceiling, which every "/ raw-tuned"
ratio is taken against. ``quix-equal-freshness`` is Quix with ``commit_interval`` set to
streamapp's commit cycle as measured in the same workload's streamapp runs (the median
time between two commits of one partition), so its state is as fresh as streamapp's
(Quix's default, 5 s, lets its views lag up to that). Every contender's final state
(streamapp's too) is checked per order (``rivals.check``).

Per contender and round: events/s, and its CPU time per event, user + system of its own
process (``os.wait4`` on the child, all its threads, start-up included) and over the timed
span only (the child's own ``getrusage``); the report gives medians and the ratios of
streamapp to each by events/s and by CPU per event.

Then, each in its own process: live latency at a fixed 2,000 events/s (publish to view,
``bench/latency.py``), catch-up replay from SQLite (``bench/replay.py``), changelog
restore (``bench/restore.py``), the RabbitMQ-fed projection against raw aio-pika
(``bench/rabbitmq.py``), view lookups local and forwarded, loaded by ``wrk``
(``bench/views.py``), and v1's live latency while v2 of its table replays 1M stored
events, against v1 alone, with the building lane's replay rate
(``bench/versions_latency.py``). A part that cannot run is reported "n/a" with the reason.

The load average is recorded before and after every part and the whole run; a run whose
1-minute load before it was above 1 is marked not quotable, and ``--publish`` (which
writes it into docs/performance.md) refuses it. The run waits up to ``--settle-s`` for the
load to fall to 1 first (services just started push it up).

Writes ``bench/results/<YYYY-MM-DD>-<HHMM>.json``, ``.md`` and ``.png`` (events/s per
contender and workload) and prints the tables. ``--quick`` is a smoke run (a few thousand
events, one round; files named ``...-quick``). Not a test: nothing asserts a timing.

    scripts/bench [--quick] [--rounds 3] [--events 100000] [--parts throughput,latency,...]
                  [--workloads 1k-orders-exactly-once,...] [--contenders NAME,...] [--publish]
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
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import child  # noqa: E402
import raw_consumer  # noqa: E402
import report  # noqa: E402
from orders_projection import ours, produce, rival  # noqa: E402

PARTS = ("throughput", "latency", "replay", "restore", "rabbitmq", "views", "versions")
QUOTABLE_LOAD = 1.0
"""A run whose 1-minute load average before it was above this is not quotable."""


@dataclasses.dataclass(frozen=True)
class Contender:
    """One column of the race: ``kind`` says how it runs, ``flags`` go to rivals.py,
    ``fetch`` to the raw consumer or streamapp (``default``, ``tuned`` or ``k=v,...``)."""

    name: str
    kind: str  # raw | streamapp[-uvloop|-dict|-typed|-traced] | quix | faust | bytewax
    flags: tuple[str, ...] = ()
    fetch: str = "default"
    equal_freshness: bool = False
    """Quix: ``commit_interval`` = streamapp's commit cycle measured in this workload."""


@dataclasses.dataclass(frozen=True)
class Workload:
    key: str
    title: str
    orders: int
    payload: str
    contenders: tuple[Contender, ...]


RAW_DEFAULT = Contender("raw-default", "raw")
RAW_TUNED = Contender("raw-tuned", "raw", fetch="tuned")
CEILING = RAW_TUNED.name
STREAMAPP = Contender("streamapp", "streamapp")
UVLOOP_CONTENDER = Contender("streamapp uvloop", "streamapp-uvloop")
"""streamapp with setting event_loop="uvloop" (the uvloop extra)."""
TRACED_CONTENDER = Contender("streamapp traced", "streamapp-traced")
"""streamapp with tracing on (the otel extra), every span made, batched and dropped by an
exporter to nowhere: tracing's own cost, beside streamapp's row (off)."""
QUIX_EOS = Contender("Quix exactly-once", "quix", ("--exactly-once",))
QUIX_ALO = Contender("Quix at-least-once", "quix")
QUIX_EQUAL_EOS = Contender(
    "quix-equal-freshness exactly-once", "quix", ("--exactly-once",), equal_freshness=True
)
QUIX_EQUAL_ALO = Contender("quix-equal-freshness at-least-once", "quix", equal_freshness=True)
BYTEWAX_RECOVERY = Contender("Bytewax recovery 1 s", "bytewax", ("--recovery",))
# streamapp comes before quix-equal-freshness in each list: round 1 runs them in list
# order, so streamapp's commit cycle is measured before Quix needs it.
WORKLOADS = (
    Workload(
        "1k-orders-exactly-once",
        "1,000 orders, standard payload (each rival's mode in its name)",
        1_000,
        "standard",
        (
            RAW_DEFAULT,
            RAW_TUNED,
            STREAMAPP,
            TRACED_CONTENDER,
            UVLOOP_CONTENDER,
            QUIX_EOS,
            QUIX_ALO,
            QUIX_EQUAL_EOS,
            Contender("faust exactly-once", "faust", ("--exactly-once",)),
        ),
    ),
    Workload(
        "10k-orders-defaults",
        "10,000 orders, standard payload (each rival's mode in its name)",
        10_000,
        "standard",
        (
            RAW_DEFAULT,
            RAW_TUNED,
            STREAMAPP,
            TRACED_CONTENDER,
            UVLOOP_CONTENDER,
            QUIX_ALO,
            QUIX_EOS,
            QUIX_EQUAL_ALO,
            Contender("faust at-least-once", "faust"),
            Contender("Bytewax recovery off", "bytewax"),
            BYTEWAX_RECOVERY,
            Contender("streamapp dict data", "streamapp-dict"),
            Contender("streamapp typed data", "streamapp-typed"),
        ),
    ),
    Workload(
        "1k-orders-exactly-once-1kb",
        "1,000 orders, 1 KB payload (each rival's mode in its name)",
        1_000,
        "1kb",
        (RAW_DEFAULT, RAW_TUNED, STREAMAPP, QUIX_EOS, QUIX_EQUAL_EOS),
    ),
    Workload(
        "10k-orders-defaults-1kb",
        "10,000 orders, 1 KB payload (each rival's mode in its name)",
        10_000,
        "1kb",
        (RAW_DEFAULT, RAW_TUNED, STREAMAPP, QUIX_ALO, QUIX_EQUAL_ALO, BYTEWAX_RECOVERY),
    ),
)
OWN_KINDS = (
    "streamapp", "streamapp-uvloop", "streamapp-dict", "streamapp-typed", "streamapp-traced"
)  # fmt: skip


def chosen_workloads(args: argparse.Namespace) -> tuple[Workload, ...]:
    """The workloads of ``--workloads``, with ``--streamapp-fetch``'s extra contender,
    each with only the contenders of ``--contenders`` when it names some."""
    chosen = [w for w in WORKLOADS if w.key in args.workloads]
    if getattr(args, "contenders", None):
        chosen = [
            dataclasses.replace(
                w, contenders=tuple(c for c in w.contenders if c.name in args.contenders)
            )
            for w in chosen
        ]
    if not args.streamapp_fetch:
        return tuple(chosen)
    extra = Contender("streamapp fetch-tuned", "streamapp", fetch=args.streamapp_fetch)
    out = []
    for w in chosen:
        at = w.contenders.index(STREAMAPP) + 1
        contenders = (*w.contenders[:at], extra, *w.contenders[at:])
        out.append(dataclasses.replace(w, contenders=contenders))
    return tuple(out)


async def throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Rounds over the workloads; per contender its runs, medians and ratios."""
    workloads = chosen_workloads(args)
    topics = {}
    for w in workloads:
        topics[w.key] = f"bench-{w.orders}-{w.payload}-{uuid.uuid4().hex[:8]}"
        print(
            f"producing {args.events:,} {w.payload} events over {w.orders:,} orders "
            f"to {topics[w.key]}",
            flush=True,
        )
        await produce(args.bootstrap, topics[w.key], args.events, w.orders, w.payload)
    runs: dict[str, dict[str, list[child.RunResult]]] = {w.key: {} for w in workloads}
    cycles: dict[str, list[float]] = {w.key: [] for w in workloads}
    for r in range(args.rounds):
        for w in workloads:
            order = w.contenders[r % len(w.contenders) :] + w.contenders[: r % len(w.contenders)]
            for c in order:
                run = await run_contender(c, args, topics[w.key], w.orders, cycles[w.key])
                runs[w.key].setdefault(c.name, []).append(run)
                if c == STREAMAPP and run.rate is not None:
                    cycle = run.extra.get("commit_cycle_s")
                    if cycle:
                        cycles[w.key].append(float(cycle))
                shown = f"{run.rate:,.0f} ev/s" if run.rate is not None else "n/a"
                cpu = run.cpu_us_per_event
                print(
                    f"round {r + 1} {w.key:<27} {c.name:<34} {shown:>12}"
                    + (f"  {cpu:,.1f} us/ev" if cpu is not None else "")
                    + (f"  load {run.load_1m}" if run.load_1m is not None else "")
                    + (f"  ({run.problem})" if run.problem else ""),
                    flush=True,
                )
    await drop_topics(args.bootstrap, list(topics.values()))
    return {
        w.key: {
            "title": w.title,
            "events": args.events,
            "orders": w.orders,
            "payload": w.payload,
            "faust_events": min(args.events, args.faust_events),
            "ceiling": CEILING,
            "raw_tuned_fetch": raw_consumer.TUNED,
            "streamapp_commit_cycle_s": median(cycles[w.key], 3),
            "contenders": summarise(w.contenders, runs[w.key]),
        }
        for w in workloads
    }


async def drop_topics(bootstrap: str, topics: list[str]) -> None:
    """Delete the bench's source topics (best effort: the next run makes its own)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        await admin.delete_topics(topics)
    except Exception as exc:  # a leftover topic harms nothing
        print(f"could not delete the bench topics: {exc!r}")
    finally:
        await admin.close()


def median(values: list[float], places: int = 1) -> float | None:
    return round(statistics.median(values), places) if values else None


def summarise(
    contenders: tuple[Contender, ...], runs: dict[str, list[child.RunResult]]
) -> dict[str, dict[str, Any]]:
    """Per contender: its rounds (events/s, CPU µs per event of the process and of the
    timed span), their medians, the median over raw-tuned's (and raw-default's), and
    streamapp's median over its, by events/s and by CPU per event (None where a side
    has no run)."""

    def values(name: str, get: Callable[[child.RunResult], float | None]) -> list[float]:
        got = (get(run) for run in runs.get(name, []) if run.rate is not None)
        return [x for x in got if x is not None]

    def rate(r: child.RunResult) -> float | None:
        return r.rate

    def cpu(r: child.RunResult) -> float | None:
        return r.cpu_us_per_event

    def span(r: child.RunResult) -> float | None:
        return r.span_cpu_us_per_event

    med = {c.name: median(values(c.name, rate)) for c in contenders}
    cpus = {c.name: median(values(c.name, cpu), 2) for c in contenders}
    spans = {c.name: median(values(c.name, span), 2) for c in contenders}
    mine = STREAMAPP.name
    out: dict[str, dict[str, Any]] = {}
    for c in contenders:
        problems = sorted({run.problem for run in runs.get(c.name, []) if run.problem})
        out[c.name] = {
            "kind": c.kind,
            "flags": list(c.flags),
            "fetch": raw_consumer.parse_fetch(c.fetch) if c.fetch else {},
            "rates": [round(x, 1) for x in values(c.name, rate)],
            "median": med[c.name],
            "cpu_us_per_event": values(c.name, cpu),
            "cpu_median": cpus[c.name],
            "span_cpu_us_per_event": values(c.name, span),
            "span_cpu_median": spans[c.name],
            "over_raw": ratio(med[c.name], med.get(CEILING)),
            "over_raw_default": ratio(med[c.name], med.get(RAW_DEFAULT.name)),
            "streamapp_over_it": ratio(med.get(mine), med[c.name]),
            "streamapp_cpu_over_it": ratio(cpus.get(mine), cpus[c.name]),
            "streamapp_span_cpu_over_it": ratio(spans.get(mine), spans[c.name]),
            "problem": "; ".join(problems) or None,
            "runs": [dataclasses.asdict(run) for run in runs.get(c.name, [])],
        }
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` to 3 places; None when either is missing (or ``b`` is 0)."""
    return round(a / b, 3) if a is not None and b else None


async def run_contender(
    c: Contender, args: argparse.Namespace, topic: str, orders: int, cycles: list[float]
) -> child.RunResult:
    """One run of ``c`` over ``topic`` in a fresh process (as every contender: nothing one
    run leaves behind slows the next), with that process's CPU time. ``cycles``:
    streamapp's commit cycles measured so far in this workload (quix-equal-freshness)."""
    if c.kind == "raw" or c.kind in OWN_KINDS:
        return await asyncio.to_thread(
            ours, c.kind, args.bootstrap, topic, args.events, orders, c.fetch
        )
    flags = c.flags
    if c.equal_freshness:
        if not cycles:
            return child.RunResult(None, "no streamapp commit cycle measured before it")
        interval = max(0.01, statistics.median(cycles))
        flags = (*flags, "--commit-interval", f"{interval:.3f}")
    n = min(args.events, args.faust_events) if c.kind == "faust" else args.events
    return await asyncio.to_thread(
        rival, c.kind, args.bootstrap, topic, n, orders, flags, args.rival_timeout, args.events
    )


def run_part(script: str, options: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``bench/<script>`` with ``--json``; its figures (and its process's CPU time),
    or ``{"n/a": reason}``."""
    with tempfile.TemporaryDirectory(prefix="bench-part-") as tmp:
        path = Path(tmp) / "out.json"
        cmd = [sys.executable, str(ROOT / "bench" / script), *options, "--json", str(path)]
        print(f"$ {' '.join(cmd[1:-2])}", flush=True)
        done = child.run(cmd, timeout_s)
        if done.timed_out:
            return {"n/a": f"{script} timed out after {timeout_s:.0f} s"}
        if done.returncode != 0 or not path.exists():
            lines = [x for x in done.stderr.strip().splitlines() if "Got error" not in x]
            return {"n/a": f"{script} failed: {(lines or ['no output'])[-1][:300]}"}
        print("\n".join(done.stdout.strip().splitlines()[-6:]), flush=True)
        figures: dict[str, Any] = json.loads(path.read_text())
        figures["wall_s"] = round(done.wall_s, 1)
        figures["process_cpu_s"] = round(done.cpu_s, 2)
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
            ["--seconds", "1" if q else "3", "--concurrency", "1" if q else "1,8"],
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
        before = loadavg()
        out[part] = run_part(script, options, timeout)
        args.loads[part] = {"before": before, "after": loadavg()}
    return out


def loadavg() -> list[float]:
    """The 1, 5 and 15-minute load averages, to 2 places."""
    return [round(x, 2) for x in os.getloadavg()]


def settle(limit_s: float) -> float:
    """Wait (up to ``limit_s``) for the 1-minute load to fall to ``QUOTABLE_LOAD``, as it
    does a minute or two after the services start; the seconds waited."""
    started = time.monotonic()
    told = False
    while os.getloadavg()[0] > QUOTABLE_LOAD and time.monotonic() - started < limit_s:
        if not told:
            print(
                f"load average {os.getloadavg()[0]:.2f} > {QUOTABLE_LOAD}: waiting up to "
                f"{limit_s:.0f} s for it to settle (--settle-s)",
                flush=True,
            )
            told = True
        time.sleep(5)
    return round(time.monotonic() - started, 1)


def machine() -> dict[str, Any]:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False)
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "uptime": uptime.stdout.strip(),
        "loadavg": loadavg(),
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
    keys = ",".join(w.key for w in WORKLOADS)
    parser.add_argument("--workloads", default=keys, help="throughput: comma list of " + keys)
    parser.add_argument(
        "--contenders",
        default="",
        help="throughput: only these contenders (comma list of names, e.g. "
        "'streamapp,streamapp traced' for tracing off and on); default: every one",
    )
    parser.add_argument(
        "--streamapp-fetch",
        default="",
        help="also run 'streamapp fetch-tuned': streamapp with these aiokafka fetch settings "
        "(tuned, or k=v,...) patched into its consumer, to try them before they are defaults",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--rival-timeout", type=float, default=300.0, help="s per rival run")
    parser.add_argument("--part-timeout", type=float, default=300.0, help="s per other part")
    parser.add_argument(
        "--settle-s",
        type=float,
        default=None,
        help=f"wait up to this long for load <= {QUOTABLE_LOAD} first (180; --quick 0)",
    )
    parser.add_argument(
        "--publish",
        action="store_true",
        help="write this run into docs/performance.md (refused from a --quick run, or when "
        f"the load average before the run was above {QUOTABLE_LOAD})",
    )
    parser.add_argument(
        "--bootstrap", default=os.environ.get("STREAMAPP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    args = parser.parse_args()
    args.events = args.events or (3_000 if args.quick else 100_000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.faust_events = args.faust_events or (1_000 if args.quick else 20_000)
    args.settle_s = args.settle_s if args.settle_s is not None else (0 if args.quick else 180)
    args.parts = [p for p in args.parts.split(",") if p]
    if unknown := set(args.parts) - set(PARTS):
        parser.error(f"unknown --parts {sorted(unknown)}; choose from {','.join(PARTS)}")
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    names = {c.name for w in WORKLOADS for c in w.contenders}
    if unknown := set(args.contenders) - names:
        parser.error(f"unknown --contenders {sorted(unknown)}; choose from {sorted(names)}")
    if unknown := set(args.workloads) - {w.key for w in WORKLOADS}:
        parser.error(f"unknown --workloads {sorted(unknown)}; choose from {keys}")
    try:
        raw_consumer.parse_fetch(args.streamapp_fetch)
    except ValueError as exc:
        parser.error(f"--streamapp-fetch: {exc}")
    if args.publish and args.quick:
        parser.error("--publish: a --quick run is a smoke run, never published")
    if args.publish and args.contenders:
        parser.error("--publish: a run of some contenders (--contenders) is never published")
    args.loads = {}

    settled = settle(args.settle_s) if args.settle_s > 0 else 0.0
    started = time.time()
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d", time.gmtime(started)),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "quick": args.quick,
        "rounds": args.rounds,
        "settled_s": settled,
        "machine_before": machine(),
    }
    load_before = results["machine_before"]["loadavg"]
    if "throughput" in args.parts:
        before = loadavg()
        results["throughput"] = await throughput(args)
        args.loads["throughput"] = {"before": before, "after": loadavg()}
    results.update(other_parts(args))
    results["machine_after"] = {"uptime": machine()["uptime"], "loadavg": loadavg()}
    results["loads"] = {"run": {"before": load_before, "after": loadavg()}, **args.loads}
    results["quotable"], results["not_quotable"] = quotable(args.quick, load_before[0])
    results["wall_s"] = round(time.time() - started, 1)

    args.out.mkdir(parents=True, exist_ok=True)
    stem = results["date"] + time.strftime("-%H%M", time.gmtime(started))
    stem += "-quick" if args.quick else ""
    json_path, png_path = args.out / f"{stem}.json", args.out / f"{stem}.png"
    md_path = args.out / f"{stem}.md"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    if "throughput" in results:
        report.chart(results, png_path)
    md_path.write_text(report.markdown(results, json_path.name, png_path.name))
    print()
    print(report.tables(results))
    written = [json_path, md_path, *([png_path] if png_path.exists() else [])]
    print(f"\nwritten: {', '.join(str(p) for p in written)}")
    if args.publish:
        try:
            print(report.publish(results, json_path, png_path))
        except report.NotQuotable as exc:
            print(f"--publish refused: {exc}", file=sys.stderr)
            sys.exit(2)


def quotable(quick: bool, load_1m: float) -> tuple[bool, str | None]:
    """(quotable, why not): a --quick run never is, nor one begun above load 1."""
    why = []
    if load_1m > QUOTABLE_LOAD:
        why.append(f"load before {load_1m:.2f} > {QUOTABLE_LOAD:g}: not quotable")
    if quick:
        why.append("--quick smoke run: not quotable")
    return not why, "; ".join(why) or None


if __name__ == "__main__":
    asyncio.run(main())
