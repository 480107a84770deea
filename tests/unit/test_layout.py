"""The layout of streamapp/ by concept (docs/architecture.md): few loose modules, no module
over the size that hides two jobs, one layers contract per package, one meaning per
module name, and the former module paths still importable for one release."""

from __future__ import annotations

import importlib
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

import streamapp

ROOT = Path(streamapp.__file__).parent
PYPROJECT = ROOT.parent / "pyproject.toml"

SAME_CONCEPT = {
    "base.py": "a package's interface and the behaviour its implementations share",
    "connection.py": "a transport's connection to its broker",
    "forwarder.py": "the forwarder (outbox relay): its loop, its HTTP face, its SQLite reads",
    "held.py": "held streams (Park(hold='stream')): their state and their view",
    "lease.py": "the owner lease: its rule and each transport's source of it",
    "ledger.py": "the app's ledger of retired versions, and Kafka's backend of it",
    "members.py": "a transport's members directory (who owns which partition)",
    "metrics.py": "metrics: the engine's counters and their Prometheus exposition",
    "parked.py": "parked deliveries: each broker's parking destination, and the command",
    "port.py": "a transport's partition port (one partition's deliveries)",
    "probe.py": "a transport's reachability probe (readiness)",
    "relay.py": "a transport's relay of the retry chain",
    "resend.py": "parked rows sent back in embedded mode: the lane's side, the follower",
    "sink.py": "a transport's confirmed publisher",
    "source.py": "a transport's source of partitions",
    "stalled.py": "stalled partitions: the engine's watch, RabbitMQ's own signal of one",
    "store.py": "a store's backend: table stores, event stores, the `store` command",
    "tables.py": "tables: the views' endpoints, the `tables` command",
    "topics.py": "topics: their specs, the `topics` command",
    "topology.py": "a transport's topics or queues, created and checked",
    "transport.py": "a transport's entry point in the registry",
    "versions.py": "table versions: the views' routes to them, the `versions` command",
    "worker.py": "the worker process, and the `worker` command",
}
"""Module names used in more than one package, each for one concept."""


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts)


def test_at_most_ten_modules_at_the_top() -> None:
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(loose) <= 10, f"{len(loose)} loose modules: give a concept a package: {loose}"


def test_no_module_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}, f"split by responsibility: {long}"


def test_a_module_name_in_two_packages_names_one_concept() -> None:
    seen: dict[str, list[str]] = {}
    for p in _modules():
        if p.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    repeated = {name: where for name, where in seen.items() if len(where) > 1}
    unexplained = {n: w for n, w in repeated.items() if n not in SAME_CONCEPT}
    assert unexplained == {}, "one name, one concept: rename, or say in SAME_CONCEPT why"
    stale = set(SAME_CONCEPT) - set(repeated)
    assert stale == set(), f"no longer repeated: drop from SAME_CONCEPT: {stale}"


def test_every_package_has_a_layers_contract_of_its_own() -> None:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    covered = {c for k in contracts if k["type"] == "layers" for c in k["containers"]}
    assert all(k.get("exhaustive") for k in contracts if k["type"] == "layers")
    packages = {
        ".".join(("streamapp", *p.parent.relative_to(ROOT).parts))
        for p in ROOT.rglob("__init__.py")
        if len(
            [
                c
                for c in p.parent.iterdir()
                if c.suffix == ".py" or (c.is_dir() and (c / "__init__.py").exists())
            ]
        )
        > 2  # __init__ and two modules or more
    }
    assert packages - covered == set(), "add a layers contract (pyproject.toml)"


@pytest.mark.parametrize(("old", "new"), sorted(streamapp.MOVED.items()))
def test_a_moved_module_imports_from_its_former_path_with_a_warning(old: str, new: str) -> None:
    sys.modules.pop(f"streamapp.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"streamapp.{old} moved to streamapp.{new}"):
        former = importlib.import_module(f"streamapp.{old}")
    assert former is importlib.import_module(f"streamapp.{new}")
    # still the module of its new place: its relative imports raise no ImportWarning
    assert former.__spec__ is not None
    assert former.__spec__.name == f"streamapp.{new}"


def test_a_module_under_a_moved_package_imports_from_its_former_path() -> None:
    sys.modules.pop("streamapp.kafka.topology", None)
    sys.modules.pop("streamapp.kafka", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        former = importlib.import_module("streamapp.kafka.topology")
    assert former is importlib.import_module("streamapp.transports.kafka.topology")


def test_the_memory_broker_keeps_its_former_name_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from streamapp.memory import MemoryBroker
    from streamapp.testing import MemoryBroker as Testing

    assert MemoryBroker is Testing
