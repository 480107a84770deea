"""``?explain=1`` and ``?as_of=POSITION`` on a running worker of the reference orders app
(embedded mode on SQLite: the store is its source): the events listed are the store's
events of the key's stream, the value folded is the one the live view serves, and a
value ``as_of`` a store position is the one the live view served when the worker had
applied the store up to it (observed then, not computed by the test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streamapp.eventstore import open_store

from .harness import WorkerProc, append_to_store, order_events, wait_exact, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _worker(tmp: Path, url: str) -> WorkerProc:
    return WorkerProc(
        "127.0.0.1:1",  # no broker: a Kafka address that nothing answers
        "explain-",
        tmp / "data",
        tmp / "worker.log",
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
