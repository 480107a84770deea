"""What the README and the docs' examples promise: their results on the memory broker, the
install lines. (That every block runs and passes ``mypy --strict``: test_docs.py.)"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path
from typing import Any

from streamapp import App, Event
from streamapp.testing import MemoryBroker
from tests.support.waits import run_watched
from tests.unit.test_docs import PAGES, PYTHON, ROOT

BLOCKS = [b.code for b in PYTHON]
"""The docs' python blocks, as test_docs.py reads them."""


def _block(needle: str) -> str:
    (found,) = [b for b in BLOCKS if needle in b]
    return found


def test_the_readme_has_its_examples() -> None:
    assert "order_status: Table" in (ROOT / "README.md").read_text()
    assert len(BLOCKS) >= 2


INDEX_INSTALL = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?streamapp\b")
"""``pip install streamapp...``: the index's ``streamapp`` is an unrelated project."""


def test_no_line_installs_streamapp_from_the_index() -> None:
    told = [
        (page.name, number, line)
        for page in PAGES
        for number, line in enumerate(page.read_text().splitlines(), start=1)
        if INDEX_INSTALL.search(line) and "someone else's code" not in line  # the warning
    ]
    assert told == [], "lines that install streamapp from the index: " + repr(told)
    text = (ROOT / "README.md").read_text()
    assert "pip install -e '.[postgres]'" in text  # the clone's way, with the extra
    assert "editable_mode=compat" in text  # what mypy needs
    assert "pip install pytest pytest-asyncio" in text


def test_the_index_install_pattern_catches_the_forms() -> None:
    for bad in (
        "pip install streamapp",
        "pip install 'streamapp[postgres]'",
        'pip install -U "streamapp[postgres]"',
        "python -m pip install streamapp==0.1",
    ):
        assert INDEX_INSTALL.search(bad), bad
    for good in ("pip install -e '.[postgres]'", "pip install '/path/to/streamapp[postgres]'"):
        assert not INDEX_INSTALL.search(good), good


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
    exec(compile(_block("sinks=[shipments]"), "docs/composition.md", "exec"), namespace)
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
    test_file.write_text(_block("async def test_paid_order"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = run_watched(
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
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout


async def test_blocking_example_runs_on_the_memory_broker() -> None:
    namespace: dict[str, Any] = {"__name__": "docs_blocking"}
    exec(compile(_block("blocking=True"), "docs/concepts.md", "exec"), namespace)
    broker = MemoryBroker(namespace["app"])
    broker.send("files", Event.create("file.added", stream_id="f-1", data={"n": 1}))
    await broker.process()
    payload = str({"n": 1}).encode()
    for _ in range(10_000):
        payload = hashlib.sha256(payload).digest()
    assert broker.table("digests")["f-1"] == payload.hex()


async def test_retry_example_runs_on_the_memory_broker() -> None:
    namespace: dict[str, Any] = {"__name__": "docs_retry"}
    exec(compile(_block("on_failure=Retry("), "docs/failures.md", "exec"), namespace)
    broker = MemoryBroker(namespace["app"])
    broker.send("orders", Event.create("order.paid", stream_id="o-2", data={}))
    await broker.process()
    assert broker.table("last_type")["o-2"] == "order.paid"


async def test_group_by_example_runs_on_the_memory_broker() -> None:
    namespace: dict[str, Any] = {"__name__": "docs_group_by"}
    exec(compile(_block("group_by=lambda"), "docs/composition.md", "exec"), namespace)
    broker = MemoryBroker(namespace["app"])
    for i, (order, amount) in enumerate((("o-1", 5), ("o-2", 7), ("o-3", 11))):
        data = {"customer": "cust-17" if i < 2 else "cust-4", "amount": amount}
        broker.send("orders", Event.create("order.placed", stream_id=order, data=data))
    await broker.process()
    assert broker.table("totals")["cust-17"] == 12
    assert broker.table("totals")["cust-4"] == 11
