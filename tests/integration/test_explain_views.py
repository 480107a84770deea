"""``?explain=1``, ``?as_of=POSITION`` and ``streamapp verify`` on a running worker (the
reference orders app, and tests/apps/verify_app.py for verify; embedded mode on SQLite:
the store is its source): the events listed are the store's
events of the key's stream, the value folded is the one the live view serves, and a
value ``as_of`` a store position is the one the live view served when the worker had
applied the store up to it (observed then, not computed by the test); ``verify`` finds
the live table equal to its rebuild, and every stream with a payment different once
the handler changed between the worker and the verify run."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamapp.eventstore import open_store
from streamapp.topics import partition_for
from tests.support.waits import until

from .harness import (
    ROOT,
    WorkerProc,
    app_env,
    append_to_store,
    create_topics,
    order_events,
    streamapp_cmd,
    wait_exact,
    wait_ready,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


VERIFY_APP = "tests.apps.verify_app:app"


def _worker(tmp: Path, url: str, app_ref: str = "agents.orders:app") -> WorkerProc:
    return WorkerProc(
        "127.0.0.1:1",  # no broker: a Kafka address that nothing answers
        "explain-",
        tmp / "data",
        tmp / "worker.log",
        app_ref=app_ref,
        extra_env={"STREAMAPP_BROKER": "none", "STREAMAPP_EVENT_STORE": url},
    )


async def _get(worker: WorkerProc, path: str) -> tuple[int, Any, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{worker.port}{path}", headers=worker.auth) as resp,
    ):
        return resp.status, await resp.json(), dict(resp.headers)


async def test_explain_lists_the_streams_events_and_as_of_answers_the_value_then(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, expected = order_events(n_orders=40, n_events=400)
    first, rest = events[:200], events[200:]
    first_expected = _expected(first)
    await append_to_store(url, first)
    worker = _worker(tmp_path, url).start()
    try:
        await wait_ready(worker)
        await wait_exact([worker], first_expected)
        store = await open_store(url)
        try:
            head_then = await store.head()
            key = max(first_expected, key=lambda k: first_expected[k][0])
            status, live_then, _ = await _get(worker, f"/tables/order_status/{key}")
            assert status == 200
            await append_to_store(url, rest)
            await wait_exact([worker], expected)
            stream = await store.read_stream(key)
        finally:
            await store.close()

        status, live, _ = await _get(worker, f"/tables/order_status/{key}")
        assert status == 200
        status, body, headers = await _get(worker, f"/tables/order_status/{key}?explain=1")
        assert status == 200, body
        assert headers["Streamapp-Folded"] == "store"
        assert [(e["position"], e["id"], e["type"]) for e in body["events"]] == [
            (s.position, s.event().id, s.event().type) for s in stream
        ]
        assert {e["outcome"] for e in body["events"]} == {"delivered"}
        assert [e["value"]["version"] for e in body["events"]] == list(range(1, len(stream) + 1))
        assert body["value"] == live  # the fold from the store is what the live view serves
        assert body["events_total"] == expected[key][0]

        status, then, headers = await _get(worker, f"/tables/order_status/{key}?as_of={head_then}")
        assert status == 200, then
        assert headers["Streamapp-As-Of"] == str(head_then)
        assert then == live_then  # the value the live view served at that store position

        status, last, _ = await _get(worker, f"/tables/order_status/{key}?explain=1&limit=1")
        assert status == 200
        assert last["events_omitted"] == len(stream) - 1
        assert [e["id"] for e in last["events"]] == [stream[-1].event().id]
    finally:
        worker.stop()


def _expected(events: list[Any]) -> dict[str, tuple[int, str]]:
    """The orders app's table after ``events``: per order, its count and last status."""
    out: dict[str, tuple[int, str]] = {}
    for e in events:
        n, _ = out.get(e.stream_id, (0, ""))
        out[e.stream_id] = (n + 1, e.type.removeprefix("order."))
    return out


def _verify(worker: WorkerProc, *args: str, bonus: int = 0) -> subprocess.CompletedProcess[str]:
    url = f"http://127.0.0.1:{worker.port}"
    return subprocess.run(
        streamapp_cmd("verify", "-A", VERIFY_APP, "totals", "--url", url, *args),
        env=app_env(
            worker.bootstrap,
            worker.namespace,
            **worker.extra_env,
            STREAMAPP_TEST_VERIFY_BONUS=str(bonus),
        ),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # a ceiling for a hang, not a budget: it checks 40 keys
        check=False,
    )


@pytest.mark.parametrize("broker", ["embedded", "kafka"])
async def test_verify_finds_the_live_table_equal_and_a_changed_handler_different(
    tmp_path: Path, broker: str, kafka_bootstrap: str
) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    events, _ = order_events(n_orders=40, n_events=400)
    await append_to_store(url, events)
    if broker == "embedded":
        worker = _worker(tmp_path, url, VERIFY_APP)
    else:  # catch-up from the store, then live on Kafka
        ns = f"vfy{uuid.uuid4().hex[:6]}-"
        create_topics(kafka_bootstrap, ns, VERIFY_APP)
        worker = WorkerProc(
            kafka_bootstrap,
            ns,
            tmp_path / "data",
            tmp_path / "worker.log",
            app_ref=VERIFY_APP,
            extra_env={"STREAMAPP_EVENT_STORE": url},
        )
    worker.start()
    try:
        await wait_ready(worker)
        await _wait_applied(worker, len(events))
        same = _verify(worker)
        assert same.returncode == 0, same.stdout + same.stderr
        assert same.stdout.startswith(
            "verified 40 streams of totals v1 at store position 400: 40 equal, 0 differ, 0 missing"
        ), same.stdout

        paid = {e.stream_id for e in events if e.type == "order.paid"}
        changed = _verify(worker, "--json", bonus=1)
        assert changed.returncode == 1, changed.stdout + changed.stderr
        found = json.loads(changed.stdout)
        assert (found["checked"], found["differ"], found["missing"]) == (40, len(paid), 0)
        example = found["differences"][0]
        assert example["key"] in paid
        assert example["rebuilt"]["paid"] > example["live"]["paid"]

        told = _verify(worker, "--report", bonus=1)
        assert told.returncode == 1, told.stderr
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{worker.port}/metrics", headers=worker.auth) as r,
        ):
            scraped = await r.text()
        line = f'streamapp_verify_last_differences{{table="totals",version="1"}} {len(paid)}.0'
        assert line in scraped

        sampled = _verify(worker, "--sample", "5", "--json")
        assert json.loads(sampled.stdout)["checked"] == 5
        on_0 = {e.stream_id for e in events if partition_for((e.stream_id or "").encode(), 4) == 0}
        part = _verify(worker, "--partitions", "0", "--json")
        assert json.loads(part.stdout)["checked"] == len(on_0)
    finally:
        worker.stop()


async def _wait_applied(worker: WorkerProc, n: int) -> None:
    """Until the worker has applied ``n`` events; fails when its count stops moving."""

    async def applied() -> int:
        status = await worker.status()
        parts = (status or {}).get("partitions", {}).values()
        return sum(p.get("outcomes", {}).get("delivered", 0) for p in parts)

    seen: list[int] = []

    async def check() -> bool:
        seen.append(await applied())
        return seen[-1] >= n

    await until(check, what=f"{n} events applied", progress=lambda: seen[-1:])
