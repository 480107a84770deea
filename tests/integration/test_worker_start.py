"""Worker start-up on a real broker: what is missing is named, never auto-created."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from .harness import WorkerProc

pytestmark = pytest.mark.integration


async def test_missing_topics_are_named_and_not_created(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"missing{uuid.uuid4().hex[:6]}-"
    worker = WorkerProc(kafka_bootstrap, ns, tmp_path / "data", tmp_path / "w.log").start()
    assert worker.proc is not None
    code = worker.proc.wait(timeout=60)
    out = worker.log_text()
    assert code != 0
    assert f"{ns}orders" in out
    assert f"{ns}orders-project_order_status-changelog" in out
    assert "streamapp topics create -A agents.orders:app" in out
    assert "Traceback" not in out  # a clear message, not a stack trace
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        assert not [t for t in await admin.list_topics() if t.startswith(ns)]
    finally:
        await admin.close()
