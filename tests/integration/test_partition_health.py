"""Projection health in time on real Kafka, with a worker process of the gate app.

A handler held on an event (``gate``: it waits for a file the test makes) keeps its
partition behind: ``lag_s`` in ``/status`` and ``streamapp_lag_seconds`` on ``/metrics``
are above 0 and grow, 0 again once it is applied. Held past ``stall_after_s`` the
partition is ``stalled`` (``/status``, ``streamapp_stalled_partitions``), logged once with
what it was doing; with every partition of the agent held, ``/readyz`` is 503 naming the
agent; all of it clears once the gate opens. A handler that fails under Redeliver, with
a backoff longer than ``stall_after_s``, is never called stalled.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamapp import Event
from streamapp.topics import partition_for
from tests.support.waits import until

from .harness import WorkerProc, alive, create_topics, produce, wait_ready, worker_progress

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = "tests.apps.gate_app:app"
PARTITIONS = 4
STALL_AFTER_S = 2.0
AGENT = "fold_v1"


def _stream_in(partition: int, prefix: str) -> str:
    return next(
        f"{prefix}{i}"
        for i in range(1000)
        if partition_for(f"{prefix}{i}".encode(), PARTITIONS) == partition
    )


def _event(kind: str, sid: str) -> Event:
    return Event.create(kind, stream_id=sid, source="tests", data={})


async def _get(worker: WorkerProc, path: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(
            f"http://127.0.0.1:{worker.port}{path}", timeout=aiohttp.ClientTimeout(total=10)
        ) as r,
    ):
        if r.content_type == "application/json":
            return r.status, await r.json()
        return r.status, await r.text()


def _metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of ``name`` with exactly ``labels`` (None: absent)."""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name) + (r"\{" + re.escape(inner) + r"\}" if labels else "") + r" (\S+)"
    found = re.search(rf"^{pattern}$", text, re.M)
    return None if found is None else float(found.group(1))


def _worker(tmp_path: Path, bootstrap: str, ns: str, **env: str) -> WorkerProc:
    gate = tmp_path / "gate"
    gate.mkdir(exist_ok=True)
    return WorkerProc(
        bootstrap,
        ns,
        tmp_path / "data",
        tmp_path / "worker.log",
        app_ref=APP,
        extra_env={
            "GATE_DIR": str(gate),
            "GATE_HELD": "1",
            "STREAMAPP_STALL_AFTER_S": str(STALL_AFTER_S),
            "STREAMAPP_AUTO_OFFSET_RESET": "earliest",
            **env,
        },
    )


def _parts(status: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {p["partition"]: p for p in status["partitions"].values()}


async def test_a_held_handler_shows_lag_in_seconds_then_a_stall_then_readyz_503(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"health{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns, APP)
    topic = f"{ns}gate-in"
    worker = _worker(tmp_path, kafka_bootstrap, ns).start()
    gate = tmp_path / "gate"
    try:
        await wait_ready(worker)
        sids = [_stream_in(p, "s") for p in range(PARTITIONS)]
        await produce(kafka_bootstrap, topic, [_event("plain", sid) for sid in sids])

        async def caught_up() -> dict[str, Any] | None:
            status = (await _get(worker, "/status"))[1]
            parts = _parts(status)
            done = all(p["processed"] >= 1 and p["lag_s"] == 0 for p in parts.values())
            return status if len(parts) == PARTITIONS and done else None

        status = await until(
            caught_up,
            what="every partition applied its event",
            progress=lambda: worker_progress([worker]),
        )
        for part in _parts(status).values():
            assert part["agents"][AGENT]["lag_s"] == 0, part
        metrics = (await _get(worker, "/metrics"))[1]
        for p in range(PARTITIONS):
            assert _metric(metrics, "streamapp_lag_seconds", agent=AGENT, partition=str(p)) == 0
        assert _metric(metrics, "streamapp_stalled_partitions") == 0

        # partition 0's handler is held on a gate event, with an event behind it
        await produce(kafka_bootstrap, topic, [_event("gate", sids[0]), _event("plain", sids[0])])
        await until(
            lambda: (gate / "reached-1").exists(),
            what="the handler reached the gate",
            progress=lambda: worker_progress([worker]),
        )
        lags: list[float] = []

        async def stalled() -> dict[str, Any] | None:
            alive([worker])
            status = (await _get(worker, "/status"))[1]
            part = _parts(status)[0]
            lags.append(part["lag_s"])
            return part if part["phase"] == "stalled" else None

        part = await until(
            stalled,
            what="partition 0 stalled",
            progress=lambda: worker_progress([worker]),  # its lag_s left out: clock alone
            stalled_s=60,
        )
        assert lags[0] > 0, lags
        assert lags[-1] > lags[0], lags
        assert part["lag_s"] >= STALL_AFTER_S, part
        assert part["stalled_s"] >= STALL_AFTER_S, part
        doing = part["stalled_doing"]
        assert f"agent '{AGENT}' handling {topic}[0]@1" in doing, doing
        assert "type gate" in doing, doing
        assert "gate_app.py" in doing, doing
        assert all(p["phase"] == "live" for n, p in _parts(await _status(worker)).items() if n), (
            "only partition 0 is stalled"
        )
        metrics = (await _get(worker, "/metrics"))[1]
        assert (_metric(metrics, "streamapp_lag_seconds", agent=AGENT, partition="0") or 0) > 0
        assert _metric(metrics, "streamapp_lag_seconds", agent=AGENT, partition="1") == 0
        assert _metric(metrics, "streamapp_stalled_partitions") == 1
        code, ready = await _get(worker, "/readyz")
        assert code == 200, ready  # 3 of 4 partitions apply
        assert ready["stalled"] == {}, ready

        # every partition of the agent held: /readyz names the agent
        await produce(kafka_bootstrap, topic, [_event("gate", sid) for sid in sids[1:]])

        async def unready() -> dict[str, Any] | None:
            alive([worker])
            code, body = await _get(worker, "/readyz")
            return body if code == 503 and body["stalled"] else None

        body = await until(
            unready,
            what="/readyz 503, every partition stalled",
            progress=lambda: worker_progress([worker]),
            stalled_s=60,
        )
        reason = body["stalled"][AGENT]
        assert f"all {PARTITIONS} partitions stalled" in reason, body
        assert "type gate" in reason, body
        metrics = (await _get(worker, "/metrics"))[1]
        assert _metric(metrics, "streamapp_stalled_partitions") == PARTITIONS
        assert _metric(metrics, "streamapp_ready") == 0  # as /readyz says

        (gate / "open").touch()

        async def cleared() -> dict[str, Any] | None:
            code, _ = await _get(worker, "/readyz")
            status = await _status(worker)
            parts = _parts(status)
            done = all(p["phase"] == "live" and p["lag_s"] == 0 for p in parts.values())
            return status if code == 200 and done else None

        await until(
            cleared,
            what="every partition applied, ready",
            progress=lambda: worker_progress([worker]),
        )
        metrics = (await _get(worker, "/metrics"))[1]
        assert _metric(metrics, "streamapp_stalled_partitions") == 0
        assert _metric(metrics, "streamapp_ready") == 1
        for p in range(PARTITIONS):
            assert _metric(metrics, "streamapp_lag_seconds", agent=AGENT, partition=str(p)) == 0
        log = worker.log_text()
        for p in range(PARTITIONS):  # each stall logged once, and its end
            assert log.count(f"{topic}[{p}] is stalled") == 1, log[-4000:]
            assert f"{topic}[{p}] is not stalled any more" in log, log[-4000:]
    finally:
        (gate / "open").touch()
        worker.stop()


async def _status(worker: WorkerProc) -> dict[str, Any]:
    code, body = await _get(worker, "/status")
    assert code == 200, body
    status: dict[str, Any] = body
    return status


async def test_a_redeliver_backoff_longer_than_stall_after_s_is_no_stall(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns = f"backoff{uuid.uuid4().hex[:6]}-"
    create_topics(kafka_bootstrap, ns, APP)
    topic = f"{ns}gate-in"
    # the first pause 3 s, then 4 s: each longer than stall_after_s (2 s)
    worker = _worker(
        tmp_path,
        kafka_bootstrap,
        ns,
        GATE_PAUSE_S=str(STALL_AFTER_S * 1.5),
        STREAMAPP_REDELIVER_BACKOFF_MAX_MS=str(int(STALL_AFTER_S * 2000)),
    ).start()
    try:
        await wait_ready(worker)
        sid = _stream_in(0, "f")
        await produce(kafka_bootstrap, topic, [_event("fail", sid), _event("plain", sid)])
        seen: list[dict[str, Any]] = []
        stalls: list[float | None] = []

        async def redelivered() -> bool:
            alive([worker])
            seen.append(_parts(await _status(worker))[0])
            metrics = (await _get(worker, "/metrics"))[1]
            stalls.append(_metric(metrics, "streamapp_stalled_partitions"))
            again = _metric(metrics, "streamapp_redeliveries_total", agent=AGENT) or 0
            return again >= 3

        await until(
            redelivered,
            what="3 redeliveries of the failing event",
            progress=lambda: worker_progress([worker]),
            poll_s=0.2,
        )
        assert {p["phase"] for p in seen} == {"live"}, [p["phase"] for p in seen]
        assert set(stalls) == {0.0}, stalls
        assert max(p["lag_s"] for p in seen) >= STALL_AFTER_S, [p["lag_s"] for p in seen]
        assert "is stalled" not in worker.log_text()
        code, ready = await _get(worker, "/readyz")
        assert code == 200, ready

        (tmp_path / "gate" / "fixed").touch()

        async def applied() -> bool:
            part = _parts(await _status(worker))[0]
            return part["processed"] >= 2 and part["lag_s"] == 0

        await until(
            applied, what="the fixed event applied", progress=lambda: worker_progress([worker])
        )
    finally:
        worker.stop()
