"""The benchmarks' arithmetic on known rounds: medians, ratios, per-round pairs, CPU per
item, and the one per-order state check every contender goes through (no broker, no
timing: the figures are made up, the expected results worked out by hand)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402
import rivals  # noqa: E402


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` under a name of its own (tests/integration has a harness too)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


harness = bench_module("harness")
rabbitmq = bench_module("rabbitmq")


def runs_of(rates: list[float], cpu_s: float = 0.0) -> list[Any]:
    """Rounds of ``rates`` events/s, each of 1,000 events and ``cpu_s`` CPU seconds."""
    return [harness.child.RunResult(rate=r, events=1000, cpu_s=cpu_s or None) for r in rates]


def test_summarise_gives_each_contender_its_median_and_its_ratios_by_rate_and_cpu() -> None:
    quix = harness.Contender("Quix exactly-once", "quix", ("--exactly-once",))
    faust = harness.Contender("faust exactly-once", "faust", ("--exactly-once",))
    contenders = (harness.RAW_TUNED, harness.STREAMAPP, quix, faust)
    runs = {
        "raw-tuned": runs_of([120.0, 80.0, 100.0], 0.005),  # median 100, 5 µs/event
        "streamapp": runs_of([50.0, 70.0, 60.0], 0.020),  # 60, 20 µs/event
        "Quix exactly-once": runs_of([30.0, 40.0, 35.0], 0.040),  # 35, 40 µs/event
        "faust exactly-once": [harness.child.RunResult(rate=None, problem="failed: no faust")],
    }
    out = harness.summarise(contenders, runs)
    raw = out["raw-tuned"]
    assert (raw["median"], raw["over_raw"], raw["streamapp_over_it"]) == (100.0, 1.0, 0.6)
    assert (raw["cpu_median"], raw["streamapp_cpu_over_it"]) == (5.0, 4.0)
    mine = out["streamapp"]
    assert (mine["median"], mine["over_raw"], mine["streamapp_over_it"]) == (60.0, 0.6, 1.0)
    q = out["Quix exactly-once"]
    assert (q["median"], q["over_raw"], q["streamapp_over_it"]) == (35.0, 0.35, 1.714)
    assert q["cpu_us_per_event"] == [40.0, 40.0, 40.0]
    assert q["streamapp_cpu_over_it"] == 0.5  # streamapp spends half Quix's CPU per event
    f = out["faust exactly-once"]
    assert (f["rates"], f["median"], f["over_raw"]) == ([], None, None)
    assert f["problem"] == "failed: no faust"


def test_summarise_takes_the_middle_two_of_an_even_count_and_needs_raw_for_over_raw() -> None:
    out = harness.summarise(
        (harness.RAW_TUNED, harness.STREAMAPP), {"streamapp": runs_of([10.0, 40.0])}
    )
    assert out["streamapp"]["median"] == 25.0
    assert out["streamapp"]["over_raw"] is None  # raw-tuned did not run
    assert out["streamapp"]["streamapp_over_it"] == 1.0
    assert out["streamapp"]["cpu_median"] is None  # no CPU figure given
    assert out["raw-tuned"]["median"] is None


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [(2.0, 3.0, 0.667), (3.0, 2.0, 1.5), (None, 2.0, None), (2.0, None, None), (2.0, 0.0, None)],
)
def test_ratio_rounds_to_three_places_and_is_none_without_both_sides(
    a: float | None, b: float | None, want: float | None
) -> None:
    assert harness.ratio(a, b) == want


def test_paired_ratio_is_the_median_of_each_rounds_pair() -> None:
    contenders = {
        "streamapp": {"rates": [60.0, 50.0, 70.0]},
        "Bytewax": {"rates": [40.0, 40.0, 50.0]},
    }
    # rounds: 1.5, 1.25, 1.4 -> median 1.4 (the ratio of the medians would be 60/40 = 1.5)
    assert report.paired_ratio(contenders, "streamapp", "Bytewax") == pytest.approx(1.4)
    contenders["Bytewax"]["rates"] = [40.0, 40.0]  # a round missing: no pairs
    assert report.paired_ratio(contenders, "streamapp", "Bytewax") is None


def test_rabbitmq_runs_give_rate_cpu_per_item_medians_and_pairs() -> None:
    run = rabbitmq.Run(items=1000, wall_s=2.0, cpu_s=0.5)
    assert (run.rate, run.cpu_us) == (500.0, 500.0)
    table = rabbitmq.Table()
    for ours, raw in [((900, 1.0, 0.9), (1000, 1.0, 0.5)), ((800, 1.0, 1.2), (1000, 0.5, 0.6))]:
        table.add("streamapp", rabbitmq.Run(*ours))
        table.add("raw", rabbitmq.Run(*raw))
    medians = table.medians()
    # streamapp: rates 900, 800 -> 850; cpu 1000, 1500 us -> 1250
    assert medians["streamapp"] == {"rate": 850.0, "cpu_us": 1250.0}
    # raw: rates 1000, 2000 -> 1500; cpu 500, 600 us -> 550
    assert medians["raw"] == pytest.approx({"rate": 1500.0, "cpu_us": 550.0})
    rate, cpu = table.paired("streamapp", "raw")
    assert rate == pytest.approx((0.9 + 0.4) / 2)  # 900/1000, 800/2000
    assert cpu == pytest.approx((0.5 + 0.4) / 2)  # 500/1000, 600/1500 us per item


def test_the_per_order_check_catches_what_a_sum_of_versions_misses() -> None:
    want = {f"order-{i:05d}": {"version": 3} for i in range(4)}  # 12 events, 4 orders
    assert rivals.check(want, 12, 4)[0]
    swapped = {**want, "order-00000": {"version": 4}, "order-00001": {"version": 2}}
    assert sum(v["version"] for v in swapped.values()) == 12  # the old check passed it
    exact, note = rivals.check(swapped, 12, 4)
    assert not exact
    assert "('order-00000', 4, 3)" in note
    missing = {k: v for k, v in want.items() if k != "order-00002"}
    assert not rivals.check(missing, 12, 4)[0]


def test_tracing_on_runs_beside_streamapp_and_contenders_can_be_picked() -> None:
    """``streamapp traced`` (tracing on, spans dropped) is a row of both standard
    workloads, run by orders_projection's ``--one streamapp-traced``; ``--contenders``
    keeps only the named rows (tracing off and on, side by side, in a short run)."""
    import argparse

    standard = [w for w in harness.WORKLOADS if w.payload == "standard"]
    for workload in standard:
        names = [c.name for c in workload.contenders]
        assert names.index("streamapp traced") == names.index("streamapp") + 1
    assert harness.TRACED_CONTENDER.kind in harness.OWN_KINDS
    source = (BENCH / "orders_projection.py").read_text()
    assert '"streamapp-traced"' in source
    assert "trace_to_nowhere()" in source
    args = argparse.Namespace(
        workloads=[w.key for w in standard],
        contenders=["streamapp", "streamapp traced"],
        streamapp_fetch="",
    )
    picked = harness.chosen_workloads(args)
    assert [[c.name for c in w.contenders] for w in picked] == [
        ["streamapp", "streamapp traced"]
    ] * len(standard)
