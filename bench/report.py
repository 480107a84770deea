"""The harness's report: its tables (Markdown, as the README shows them) and its chart.

``tables`` and ``chart`` read the results dict that bench/harness.py writes as JSON, so a
past run's file can be shown again: ``.venv/bin/python bench/report.py bench/results/D.json``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

PACKAGES = ("streamapp", "aiokafka", "quixstreams", "faust-streaming", "bytewax", "rocksdict")

BYTEWAX_GOAL = 1.2
"""streamapp / Bytewax with recovery on, 10,000-order workload: at least this."""
RABBITMQ_GOAL = 0.8
"""streamapp RabbitSource / raw aio-pika: at least this."""
VIEWS_P99_GOALS_MS = {"local": 2.0, "forwarded": 10.0}


def tables(results: dict[str, Any]) -> str:
    """The throughput table with its ratios, then the other figures against their goals."""
    lines = []
    box = results["machine_before"]
    lines.append(
        f"{box['cpus']} CPUs, {box['kafka']}; load average before "
        f"{box['loadavg']}, after {[round(x, 2) for x in results['machine_after']['loadavg']]}"
    )
    if "throughput" in results:
        lines.append("")
        lines.append(
            f"| workload (events) | contender | median ev/s | / raw aiokafka | streamapp / it "
            f"| rounds ev/s (median of {results['rounds']}) |"
        )
        lines.append("|---|---|--:|--:|--:|---|")
        for w in results["throughput"].values():
            for name, c in w["contenders"].items():
                events = w["faust_events"] if name.startswith("faust") else w["events"]
                label = f"{w['orders']:,} orders ({events // 1000}k)"
                if c["median"] is None:
                    lines.append(f"| {label} | {name} | n/a | | | {c['problem']} |")
                    continue
                rounds = ", ".join(f"{x:,.0f}" for x in c["rates"])
                note = f" ({c['problem']})" if c["problem"] else ""
                lines.append(
                    f"| {label} | {name} | {c['median']:,.0f} | {fmt(c['over_raw'])} "
                    f"| {fmt(c['streamapp_over_it'])} | {rounds}{note} |"
                )
    lines.append("")
    lines.append("| figure | value | goal |")
    lines.append("|---|---|---|")
    for row in figures(results):
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def figures(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    bw = results.get("throughput", {}).get("10k-orders-defaults", {}).get("contenders", {})
    over = bw.get("Bytewax recovery 1 s", {}).get("streamapp_over_it")
    pairs = paired_ratio(bw, "streamapp", "Bytewax recovery 1 s")
    rows.append(
        (
            "streamapp / Bytewax (recovery every 1 s), 10,000 orders",
            "n/a"
            if over is None
            else f"{over:.2f}" + ("" if pairs is None else f" (per-round pairs {pairs:.2f})"),
            f">= {BYTEWAX_GOAL} " + verdict(over, lambda x: x >= BYTEWAX_GOAL),
        )
    )
    lat = results.get("latency", {})
    rows.append(
        (
            f"live latency publish to view at {lat.get('rate', 2000):,} ev/s, p50 / p99",
            na(lat) or f"{lat['p50_ms']:.1f} ms / {lat['p99_ms']:.1f} ms",
            "",
        )
    )
    rep = results.get("replay", {})
    rows.append(
        (
            "catch-up replay from SQLite, 8 partitions"
            + (f" ({rep['events']:,} events)" if "events" in rep else ""),
            na(rep) or f"{rep['medians']['sqlite']:,.0f} ev/s",
            "",
        )
    )
    res = results.get("restore", {})
    rows.append(
        (
            "changelog restore (8 partitions)",
            na(res) or f"{res['median_records_per_s']:,.0f} records/s",
            "",
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
    for run in views.get("runs", []):
        goal = VIEWS_P99_GOALS_MS[run["mode"]]
        rows.append(
            (
                f"view lookup p99, {run['mode']}, concurrency {run['concurrency']}",
                f"{run['p99_ms']:.2f} ms (p50 {run['p50_ms']:.2f}, {run['rps']:,.0f} req/s)",
                f"<= {goal:g} ms " + verdict(run["p99_ms"], lambda x, g=goal: x <= g),
            )
        )
    return rows


def paired_ratio(contenders: dict[str, Any], a: str, b: str) -> float | None:
    """Median over rounds of a/b, each round's two runs taken in the same round (steadier
    than a ratio of medians on a noisy machine); None unless both ran every round."""
    ra, rb = contenders.get(a, {}).get("rates", []), contenders.get(b, {}).get("rates", [])
    if not ra or len(ra) != len(rb):
        return None
    return float(statistics.median(x / y for x, y in zip(ra, rb, strict=True)))


def na(part: dict[str, Any]) -> str:
    return f"n/a: {part['n/a']}" if "n/a" in part else ("n/a: not run" if not part else "")


def fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def verdict(value: float | None, ok: Any) -> str:
    return "" if value is None else ("(met)" if ok(value) else "(NOT met)")


def chart(results: dict[str, Any], path: Path) -> None:
    """Bars of median events/s per contender, one panel per workload, min-max whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import StrMethodFormatter

    workloads = list(results["throughput"].values())
    fig, axes = plt.subplots(1, len(workloads), figsize=(6.5 * len(workloads), 4.2))
    for ax, w in zip(axes if len(workloads) > 1 else [axes], workloads, strict=True):
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
        ax.bar_label(bars, labels=[f"{m:,.0f}" for m in medians], padding=4, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("events/s (median; whiskers: min-max of rounds)")
        ax.set_title(f"{w['events']:,} events, {w['title']}", fontsize=10)
        ax.set_xlim(0, max([*medians, 1]) * 1.35)
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    box = results["machine_before"]
    fig.suptitle(
        f"order_status projection, {results['date']}: {box['cpus']} CPUs, load "
        f"{box['loadavg'][0]:.1f}, {box['kafka'].split(' (')[0]}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    print(tables(json.loads(Path(sys.argv[1]).read_text())))
