"""The README's Python examples run as written and pass ``mypy --strict``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamapp import App, Event
from streamapp.memory import MemoryBroker

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def _block(needle: str) -> str:
    (found,) = [b for b in BLOCKS if needle in b]
    return found


def test_the_readme_has_its_examples() -> None:
    assert len(BLOCKS) >= 2


async def test_agent_example_runs_on_the_memory_broker() -> None:
    namespace: dict[str, Any] = {"__name__": "readme_agent"}
    exec(compile(_block("order_status: Table"), "README.md", "exec"), namespace)
    app = namespace["app"]
    assert isinstance(app, App)
    broker = MemoryBroker(app)
    broker.send("orders", Event.create("order.placed", stream_id="o-9", data={}, version=1))
    broker.send("orders", Event.create("order.paid", stream_id="o-9", data={}, version=2))
    await broker.process()
    assert broker.table("order_status")["o-9"] == {"status": "paid", "version": 2}


async def test_outputs_example_runs_on_the_memory_broker() -> None:
    namespace: dict[str, Any] = {"__name__": "readme_outputs"}
    exec(compile(_block("sinks=[shipments]"), "README.md", "exec"), namespace)
    app = namespace["app"]
    broker = MemoryBroker(app)
    for i, kind in enumerate(("payment.started", "payment.completed")):
        event = Event.create(kind, stream_id="o-1", data={"amount": 10 + i}, id=f"p{i}")
        broker.send("payments", event)
    await broker.process()
    assert broker.table("paid")["o-1"] == 21
    assert broker.table("kinds")["o-1"] == {"payment.started": 1, "payment.completed": 1}
    assert broker.table("shipped")["o-1"] == {"paid": 21, "requested_by": "p1/shipment"}
    assert len(broker.records("shipments")) == 1


def test_memory_broker_example_passes_under_pytest_asyncio(tmp_path: Path) -> None:
    test_file = tmp_path / "test_readme_example.py"
    test_file.write_text(_block("MemoryBroker"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-c",
            os.devnull,
            "-p",
            "no:cacheprovider",
            "-o",
            "asyncio_mode=auto",
            str(test_file),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout


@pytest.mark.timeout(300)
def test_examples_pass_mypy_strict(tmp_path: Path) -> None:
    files = []
    for i, block in enumerate(BLOCKS):
        path = tmp_path / f"readme_example_{i}.py"
        path.write_text(block)
        files.append(str(path))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", *files],
        cwd=ROOT,  # the project's mypy settings; agents/ and tables/ importable
        env=dict(os.environ, MYPYPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
