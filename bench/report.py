"""The harness's report: its tables (Markdown, as docs/performance.md shows them), its chart,
and ``publish``, which writes a run into docs/performance.md (never a run begun above load 1).

``tables`` and ``chart`` read the results dict that bench/harness.py writes as JSON, so a
past run's file can be shown again: ``.venv/bin/python bench/report.py bench/results/D.json``
(``--publish`` to write that run into docs/performance.md, with the same refusal).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "performance.md"
PACKAGES = ("streamapp", "aiokafka", "quixstreams", "faust-streaming", "bytewax", "rocksdict")

QUOTABLE_LOAD = 1.0
"""A run whose 1-minute load average before it was above this is not quotable."""
BYTEWAX_GOAL = 1.5
"""streamapp / Bytewax with recovery on, 10,000-order workloads: at least this."""
RABBITMQ_GOAL = 0.95
"""streamapp RabbitSource / raw aio-pika: at least this."""
THROUGHPUT_GOALS: tuple[tuple[str, Callable[[str], bool], float, bool], ...] = (
    ("Quix exactly-once", lambda name: name == "Quix exactly-once", 2.0, True),
    ("Quix at-least-once", lambda name: name == "Quix at-least-once", 1.5, True),
    ("Quix at equal freshness", lambda name: name.startswith("quix-equal-freshness"), 2.0, False),
    (
        "Bytewax with recovery",
        lambda name: name.startswith("Bytewax recovery 1"),
        BYTEWAX_GOAL,
        False,
    ),
)
"""Issue 30's throughput targets on every workload: (rival, which contenders, streamapp /
it at least this, also by CPU per event)."""
RAW_GOAL = 0.5
"""streamapp / the raw ceiling (raw-tuned), events/s: at least this."""
LATENCY_GOAL_MS = 25.0
"""Live publish-to-view p99 at 2,000 ev/s on a quiet machine: at most this."""
REPLAY_GOAL = 250_000
"""Catch-up replay from SQLite, 8 partitions: at least this many events/s."""
RESTORE_GOAL = 500_000
"""Changelog restore: at least this many records/s."""
VIEWS_GOALS: dict[tuple[str, int | None], tuple[float, float | None]] = {
    ("local", 1): (1.0, None),
    ("local", 8): (2.0, 15_000.0),
    ("forwarded", None): (10.0, None),
}
"""View lookups (issue 19; forwarded: issue 8), by mode and concurrency (None: any):
(p99 at most, ms; requests/s at least, or None)."""
PAYLOAD_LABELS = {"standard": "standard", "1kb": "1 KB"}


class NotQuotable(Exception):
    """The run may not be quoted (published): why."""


def not_quotable(results: dict[str, Any]) -> str | None:
    """Why the run may not be quoted, or None (older files: from their load and mode)."""
    if "not_quotable" in results:
        quoted: str | None = results["not_quotable"]
        return quoted
    why = []
    load = results["machine_before"]["loadavg"][0]
    if load > QUOTABLE_LOAD:
        why.append(f"load before {load:.2f} > {QUOTABLE_LOAD:g}: not quotable")
    if results.get("quick"):
        why.append("--quick smoke run: not quotable")
    return "; ".join(why) or None


def tables(results: dict[str, Any]) -> str:
    """The load, the throughput table with its ratios, then the other figures."""
    lines = []
    box = results["machine_before"]
    lines.append(
        f"{box['cpus']} CPUs, {box['kafka']}; load average before "
        f"{box['loadavg']}, after {[round(x, 2) for x in results['machine_after']['loadavg']]}"
    )
    why = not_quotable(results)
    lines += ["", f"**{why}**" if why else "Quotable: load before the run <= 1."]
    if results.get("loads"):
        lines += ["", "| part | load average before (1, 5, 15 min) | after |", "|---|---|---|"]
        for part, load in results["loads"].items():
            lines.append(f"| {part} | {load_text(load['before'])} | {load_text(load['after'])} |")
    if "throughput" in results:
        lines += throughput_table(results)
    lines.append("")
    lines.append("| figure | value | goal |")
    lines.append("|---|---|---|")
    for row in [*target_rows(results), *figures(results)]:
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def load_text(load: list[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in load)


def throughput_table(results: dict[str, Any]) -> list[str]:
    """One row per workload and contender: events/s and CPU per event, with ratios."""
    workloads = list(results["throughput"].values())
    ceiling = workloads[0].get("ceiling", "raw aiokafka") if workloads else "raw-tuned"
    lines = [
        "",
        f"| workload (events) | contender | median ev/s | / {ceiling} | streamapp / it, ev/s "
        f"| CPU µs/ev | streamapp / it, CPU/ev | CPU µs/ev, timed span "
        f"| rounds ev/s (CPU µs/ev), median of {results['rounds']} |",
        "|---|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    for w in workloads:
        for name, c in w["contenders"].items():
            events = w["faust_events"] if name.startswith("faust") else w["events"]
            payload = PAYLOAD_LABELS.get(w.get("payload", "standard"), w.get("payload"))
            label = f"{w['orders']:,} orders, {payload} ({events // 1000}k)"
            if c["median"] is None:
                why = c["problem"] or "no rate"
                lines.append(f"| {label} | {name} | n/a | | | | | | {why} |")
                continue
            rounds = ", ".join(round_text(run) for run in c["runs"]) if "runs" in c else ""
            rounds = rounds or ", ".join(f"{x:,.0f}" for x in c["rates"])  # older files
            note = f" ({c['problem']})" if c["problem"] else ""
            lines.append(
                f"| {label} | {name} | {c['median']:,.0f} | {fmt(c['over_raw'])} "
                f"| {fmt(c['streamapp_over_it'])} | {fmt(c.get('cpu_median'), 1)} "
                f"| {fmt(c.get('streamapp_cpu_over_it'))} | {fmt(c.get('span_cpu_median'), 1)} "
                f"| {rounds}{note} |"
            )
    notes = throughput_notes(workloads)
    return [*lines, "", *notes] if notes else lines


def round_text(run: dict[str, Any]) -> str:
    """One round: its events/s (its process's CPU µs per event), or n/a."""
    if run.get("rate") is None:
        return "n/a"
    cpu = run["cpu_s"] * 1e6 / run["events"] if run.get("cpu_s") and run.get("events") else None
    return f"{run['rate']:,.0f}" + (f" ({cpu:,.1f})" if cpu is not None else "")


def throughput_notes(workloads: list[dict[str, Any]]) -> list[str]:
    """What the columns are, raw-tuned's settings, and the commit cycle Quix was given."""
    if not workloads or "ceiling" not in workloads[0]:
        return []
    tuned = ", ".join(f"{k}={v:,}" for k, v in workloads[0].get("raw_tuned_fetch", {}).items())
    notes = [
        "CPU µs/ev: user + system CPU time of the contender's own process (all its threads, "
        "start-up and shutdown included; `os.wait4`) per event read; timed span: the same "
        "over the span the rate is timed on (the child's own `getrusage`). "
        '"streamapp / it, CPU/ev" below 1: streamapp spends less CPU per event than it.',
        "",
        f"raw-default: aiokafka's fetch defaults; raw-tuned (the ceiling): {tuned}.",
    ]
    cycles = [
        f"{w['orders']:,} orders, {PAYLOAD_LABELS.get(w['payload'], w['payload'])}: "
        + (
            f"{w['streamapp_commit_cycle_s']:.2f} s"
            if w.get("streamapp_commit_cycle_s") is not None
            else "n/a"
        )
        for w in workloads
    ]
    notes += [
        "",
        "streamapp's commit cycle (median time between two commits of one partition, each "
        "making its state visible), the commit_interval quix-equal-freshness ran with "
        "(Quix's default: 5 s): " + "; ".join(cycles) + ".",
    ]
    return notes


def target_rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Issue 30's throughput targets, one row per workload and rival: streamapp / it by
    events/s (and by CPU per event where the target says so), and / the raw ceiling."""
    rows: list[tuple[str, str, str]] = []
    for w in results.get("throughput", {}).values():
        payload = PAYLOAD_LABELS.get(w.get("payload", "standard"), w.get("payload"))
        label = f"{w['orders']:,} orders, {payload}"
        contenders = w["contenders"]
        for rival, picks, goal, by_cpu in THROUGHPUT_GOALS:
            for name, c in contenders.items():
                if not picks(name) or c.get("median") is None:
                    continue
                rate, cpu = c.get("streamapp_over_it"), c.get("streamapp_cpu_over_it")
                per_cpu = None if cpu in (None, 0) else 1 / cpu  # it / streamapp, CPU/ev
                pairs = paired_ratio(contenders, "streamapp", name)
                value = (
                    f"{fmt(rate)} by events/s"
                    + ("" if pairs is None else f" (per-round pairs {pairs:.2f})")
                    + (f", {fmt(per_cpu)} by CPU per event" if by_cpu else "")
                )
                met = rate is not None and rate >= goal
                if by_cpu:
                    met = met and per_cpu is not None and per_cpu >= goal
                rows.append(
                    (
                        f"streamapp / {name} ({rival}), {label}",
                        value,
                        f">= {goal:g}"
                        + (" both" if by_cpu else "")
                        + (" (met)" if met else " (NOT met)"),
                    )
                )
        ours = contenders.get("streamapp", {})
        raw = ours.get("over_raw")
        rows.append(
            (
                f"streamapp / raw-tuned (the ceiling), {label}",
                fmt(raw),
                f">= {RAW_GOAL:g} " + verdict(raw, lambda x: x >= RAW_GOAL),
            )
        )
    return rows


def figures(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    lat = results.get("latency", {})
    how = "through HTTP, a worker process" if lat.get("mode") == "http" else "in-process"
    rows.append(
        (
            f"live latency publish to view at {lat.get('rate', 2000):,} ev/s ({how}), p50 / p99",
            na(lat) or f"{lat['p50_ms']:.1f} ms / {lat['p99_ms']:.1f} ms",
            f"p99 <= {LATENCY_GOAL_MS:g} ms "
            + verdict(None if na(lat) else lat["p99_ms"], lambda x: x <= LATENCY_GOAL_MS),
        )
    )
    inside = lat.get("in_process")
    if inside:
        rows.append(
            (
                "live latency, in-process (committed store read directly), p50 / p99",
                f"{inside['p50_ms']:.1f} ms / {inside['p99_ms']:.1f} ms",
                "",
            )
        )
    rep = results.get("replay", {})
    rows.append(
        (
            "catch-up replay from SQLite, 8 partitions"
            + (f" ({rep['events']:,} events)" if "events" in rep else ""),
            na(rep) or f"{rep['medians']['sqlite']:,.0f} ev/s",
            f">= {REPLAY_GOAL:,} ev/s "
            + verdict(None if na(rep) else rep["medians"]["sqlite"], lambda x: x >= REPLAY_GOAL),
        )
    )
    res = results.get("restore", {})
    rows.append(
        (
            "changelog restore (8 partitions)",
            na(res) or f"{res['median_records_per_s']:,.0f} records/s",
            f">= {RESTORE_GOAL:,} records/s "
            + verdict(
                None if na(res) else res["median_records_per_s"], lambda x: x >= RESTORE_GOAL
            ),
        )
    )
    rmq = results.get("rabbitmq", {})
    value = paired = None
    if not na(rmq):
        value = rmq["consume"]["ratio_streamapp_raw"]
        paired = rmq["consume"]["paired_ratio_streamapp_raw"]
    rows.append(
        (
            "RabbitMQ-fed projection / raw aio-pika (events/s)",
            na(rmq) or f"{value:.2f} (per-round pairs {paired:.2f})",
            f">= {RABBITMQ_GOAL} " + verdict(value, lambda x: x >= RABBITMQ_GOAL),
        )
    )
    ver = results.get("versions", {})
    alone, building = ver.get("v1_alone", {}), ver.get("v1_while_v2_builds", {})
    rows.append(
        (
            "v1 live p99 at 1,000 ev/s: alone / while v2 replays"
            + (f" {ver['events']:,} events" if "events" in ver else ""),
            na(ver) or f"{alone.get('p99_ms')} ms / {building.get('p99_ms')} ms",
            "",
        )
    )
    rows.append(
        (
            "v2's building lane: replay rate beside live v1",
            na(ver) or f"{building.get('v2_replay_rate', 'n/a')} ev/s",
            "",
        )
    )
    views = results.get("views", {})
    if na(views):
        rows.append(("view lookups p99, local and forwarded", na(views), ""))
    client = " (wrk)" if views.get("client") == "wrk" else ""
    runs = views.get("runs", [])
    for run in runs:
        goal, met = views_goal(run)
        of_ceiling = ceiling_ratio(run, runs)
        rows.append(
            (
                f"view lookup p99, {run['mode']}, concurrency {run['concurrency']}{client}",
                f"{run['p99_ms']:.2f} ms (p50 {run['p50_ms']:.2f}, {run['rps']:,.0f} req/s"
                + (f", CPU {run['cpu_us']:.0f} µs a request" if "cpu_us" in run else "")
                + ("" if of_ceiling is None else f", {of_ceiling:.2f} of bare aiohttp's req/s")
                + ")",
                goal and f"{goal} " + ("(met)" if met else "(NOT met)"),
            )
        )
    return rows


def ceiling_ratio(run: dict[str, Any], runs: list[dict[str, Any]]) -> float | None:
    """A local lookup run's req/s over the bare aiohttp server's at the same concurrency
    (``bench/views_ceiling.py``), median of the rounds' pairs; None for other runs or
    files without the ceiling."""
    if run["mode"] != "local":
        return None
    for other in runs:
        if other["mode"] == "aiohttp bare" and other["concurrency"] == run["concurrency"]:
            pairs = zip(run.get("rounds", []), other.get("rounds", []), strict=False)
            ratios = [a["rps"] / b["rps"] for a, b in pairs if b["rps"]]
            return float(statistics.median(ratios)) if ratios else None
    return None


def views_goal(run: dict[str, Any]) -> tuple[str, bool | None]:
    """The goal of a view lookup run (its mode and concurrency) and whether its medians
    meet it: ("", None) for a run the issues set no goal for."""
    mode, conc = run["mode"], run["concurrency"]
    goal = VIEWS_GOALS.get((mode, conc)) or VIEWS_GOALS.get((mode, None))
    if goal is None:
        return "", None
    p99, rps = goal
    if rps is None:
        return f"p99 <= {p99:g} ms", run["p99_ms"] <= p99
    met = run["p99_ms"] <= p99 and run["rps"] >= rps
    return f"p99 <= {p99:g} ms and >= {rps:,.0f} req/s", met


def paired_ratio(contenders: dict[str, Any], a: str, b: str) -> float | None:
    """Median over rounds of a/b, each round's two runs taken in the same round (steadier
    than a ratio of medians on a noisy machine); None unless both ran every round."""
    ra, rb = contenders.get(a, {}).get("rates", []), contenders.get(b, {}).get("rates", [])
    if not ra or len(ra) != len(rb):
        return None
    return float(statistics.median(x / y for x, y in zip(ra, rb, strict=True)))


def na(part: dict[str, Any]) -> str:
    return f"n/a: {part['n/a']}" if "n/a" in part else ("n/a: not run" if not part else "")


def fmt(x: float | None, places: int = 2) -> str:
    return "n/a" if x is None else f"{x:,.{places}f}"


def verdict(value: float | None, ok: Any) -> str:
    return "" if value is None else ("(met)" if ok(value) else "(NOT met)")


def chart(results: dict[str, Any], path: Path) -> None:
    """Bars of median events/s per contender (labelled with CPU µs per event), one panel
    per workload, min-max whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import StrMethodFormatter

    workloads = list(results["throughput"].values())
    cols = min(len(workloads), 2)
    rows = math.ceil(len(workloads) / cols)
    fig, grid = plt.subplots(rows, cols, figsize=(7.5 * cols, 4.4 * rows), squeeze=False)
    axes = [ax for row in grid for ax in row]
    for ax in axes[len(workloads) :]:
        ax.set_visible(False)
    for ax, w in zip(axes, workloads, strict=False):
        shown = [(n, c) for n, c in w["contenders"].items() if c["median"] is not None]
        names = [n for n, _ in shown]
        medians = [c["median"] for _, c in shown]
        lows = [c["median"] - min(c["rates"]) for _, c in shown]
        highs = [max(c["rates"]) - c["median"] for _, c in shown]
        colors = ["#888888" if n.startswith("raw") else "#1f77b4" for n in names]
        colors = [
            "#d62728" if n == "streamapp" else col for n, col in zip(names, colors, strict=True)
        ]
        bars = ax.barh(names, medians, xerr=[lows, highs], color=colors, capsize=3)
        labels = [
            f"{m:,.0f}" + (f", {c['cpu_median']:,.0f} µs/ev" if c.get("cpu_median") else "")
            for m, (_, c) in zip(medians, shown, strict=True)
        ]
        ax.bar_label(bars, labels=labels, padding=4, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("events/s (median; whiskers: min-max of rounds); label: CPU per event")
        ax.set_title(f"{w['events']:,} events, {w['title'].split(' (')[0]}", fontsize=10)
        ax.set_xlim(0, max([*medians, 1]) * 1.5)
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    box = results["machine_before"]
    why = not_quotable(results)
    fig.suptitle(
        f"order_status projection, {results['date']}: {box['cpus']} CPUs, load "
        f"{box['loadavg'][0]:.1f}, {box['kafka'].split(' (')[0]}" + (f" ({why})" if why else ""),
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: dict[str, Any], json_name: str, png_name: str) -> str:
    """The run's own page (bench/results/<stem>.md): its tables and chart."""
    title = f"# scripts/bench, {results['started_utc']}" + (
        " (--quick)" if results["quick"] else ""
    )
    out = [title, "", f"[JSON]({json_name}): every round, the machine before and after.", ""]
    out.append(tables(results))
    if "throughput" in results:
        out += ["", f"![events/s per contender and workload]({png_name})"]
    return "\n".join(out) + "\n"


LATEST = "## The latest run"


def publish(results: dict[str, Any], json_path: Path, png_path: Path, page: Path = PAGE) -> str:
    """Write ``results`` into ``page``'s "The latest run" section, moving the run it held
    to ``bench/results/<its stem>.md``; raises NotQuotable (the page left as it is) for a
    run begun above load 1, a --quick run, or one without the throughput part."""
    why = not_quotable(results)
    if why:
        raise NotQuotable(f"{why}; {page.name} left as it is")
    if "throughput" not in results:
        raise NotQuotable(f"no throughput part in this run; {page.name} left as it is")
    text = page.read_text()
    start = text.find(LATEST)
    if start < 0:
        raise NotQuotable(f"no {LATEST!r} section in {page}")
    end = text.find("\n## ", start + len(LATEST))
    end = len(text) if end < 0 else end + 1
    done = []
    archived = archive(text[start:end], page)
    if archived:
        done.append(f"moved the run it held to {archived}")
    rel_json = os.path.relpath(json_path, page.parent)
    rel_png = os.path.relpath(png_path, page.parent)
    box = results["machine_before"]
    packages = ", ".join(f"{k} {v}" for k, v in box["packages"].items() if v)
    section = "\n".join(
        [
            LATEST,
            "",
            f"The latest `scripts/bench` run, {results['started_utc']} ([JSON]({rel_json}), "
            f"every round and the machine's `uptime` before and after; chart below), "
            f"written by `bench/harness.py --publish`. Machine: {box['cpus']} CPUs, "
            f"{box['platform']}, Python {box['python']}; {box['kafka']}. Packages: "
            f"{packages}. Events/s of the order_status projection and CPU time per event of "
            f"each contender's process, median of {results['rounds']} alternating rounds.",
            "",
            tables(results),
            "",
            f"![events/s per contender and workload]({rel_png})",
            "",
            "Read the ratios, not the rates, and not one run alone: on 2 shared cores a "
            "contender's rounds vary by up to 1.5x. CPU per event moves far less with the "
            "machine's load than a rate does.",
            "",
        ]
    )
    page.write_text(text[:start] + section + text[end:])
    done.insert(0, f"wrote the run into {page}")
    return "; ".join(done)


def archive(section: str, page: Path) -> Path | None:
    """Save the run a "latest run" section holds as bench/results/<stem>.md (its links
    made relative to there), unless that file exists; its path, or None."""
    found = re.search(r"\]\(\.\./bench/results/([\w.-]+)\.json\)", section)
    if not found:
        return None
    target = page.parent.parent / "bench" / "results" / f"{found.group(1)}.md"
    if target.exists():
        return None
    body = section.replace(LATEST, f"# scripts/bench, {found.group(1)} (a past run)", 1)
    body = body.replace("](../bench/results/", "](")
    body = re.sub(r"\]\(\.\./(?!\.\./)", "](../../", body)
    note = (
        "Moved here from [docs/performance.md](../../docs/performance.md) by "
        "`bench/harness.py --publish`; that page has the latest run.\n\n"
    )
    head, _, rest = body.partition("\n\n")
    target.write_text(f"{head}\n\n{note}{rest.rstrip()}\n")
    return target


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--publish"]
    if len(args) != 1:
        sys.exit("usage: bench/report.py RESULTS.json [--publish]")
    path = Path(args[0])
    results = json.loads(path.read_text())
    if "--publish" not in sys.argv:
        print(tables(results))
        return
    try:
        print(publish(results, path, path.with_suffix(".png")))
    except NotQuotable as exc:
        sys.exit(f"--publish refused: {exc}")


if __name__ == "__main__":
    main()
