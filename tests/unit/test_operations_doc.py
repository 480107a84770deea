"""docs/operations.md's alert rules name only metrics streamapp serves, and its readiness
table every reason ``/readyz`` gives."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operations.md"


def _served() -> set[str]:
    """Metric names in the code (a counter also as ``_total``, as Prometheus shows it)."""
    names: set[str] = set()
    for path in (ROOT / "streamapp").rglob("*.py"):
        names.update(re.findall(r"\"(streamapp_\w+)\"", path.read_text()))
    forwarder = (ROOT / "streamapp" / "web" / "forwarder.py").read_text()
    names.update(f"streamapp_forwarder_{n}" for n in re.findall(r'gauge\(\s*"(\w+)"', forwarder))
    return names | {f"{n}_total" for n in names}


def test_every_metric_of_the_alert_rules_is_served() -> None:
    (rules,) = re.findall(r"^```yaml\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    used = set(re.findall(r"\b(streamapp_\w+)\b", rules)) - {"streamapp"}
    assert used, rules
    assert used <= _served(), sorted(used - _served())


def test_the_readiness_table_names_every_reason_of_readyz() -> None:
    health = (ROOT / "streamapp" / "web" / "health.py").read_text()
    body = health[health.index("def readiness(") :]
    keys = set(re.findall(r'"(\w+)":', body)) - {"ready", "partitions"}
    text = PAGE.read_text()
    assert keys, body
    assert {k for k in keys if f"| `{k}` |" not in text} == set()
