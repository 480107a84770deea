"""The held-stream scenario shared by the Kafka, RabbitMQ and embedded tests.

1,000 streams of ``tests/apps/held_app.py``, three events each, sent version by version
(every stream's 1, then every 2, then every 3), with the second event of five streams in
the middle poison: while the gate file exists they fail, and hold their streams. What a
table must then be is the fixed handler's fold from scratch (:func:`expected`): the
same :func:`~tests.apps.held_app.fold`, over each stream's events in order.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson

from streamapp import App, Event
from streamapp.codecs import amqp as codec
from streamapp.transports.rabbitmq.sink import RabbitSink
from streamapp.web.held import HELD_HEADER
from tests.apps.held_app import fold
from tests.support.waits import frozen, run_watched, until

from .harness import ROOT, WorkerProc, alive, app_env, append_to_store, streamapp_cmd

APP = "tests.apps.held_app:app"
STREAMS = 1000
POISONED = tuple(f"acct-{i}" for i in (150, 350, 500, 650, 850))


def events(streams: int = STREAMS, versions: tuple[int, ...] = (1, 2, 3)) -> list[Event]:
    """Every stream's events of ``versions``, version by version; the 2s of
    :data:`POISONED` are poison."""
    out = []
    for version in versions:
        for i in range(streams):
            sid = f"acct-{i}"
            kind = "poison" if version == 2 and sid in POISONED else "moved"
            data = {"amount": (i * 7 + version * 13) % 101}
            out.append(Event.create(kind, stream_id=sid, data=data, version=version))
    return out


def later(version: int) -> list[Event]:
    """A live event of each poisoned stream at ``version`` (after its held ones)."""
    return [
        Event.create("moved", stream_id=sid, data={"amount": version}, version=version)
        for sid in POISONED
    ]


def expected(sent: list[Event], *, held: bool) -> dict[str, dict[str, Any] | None]:
    """Each stream's value, folded from scratch by the fixed handler; with ``held``,
    the poisoned streams stop before their version 2 (their last applied value)."""
    out: dict[str, dict[str, Any] | None] = {}
    for event in sorted(sent, key=lambda e: e.stream_version or 0):
        sid = event.stream_id
        assert sid is not None
        if held and sid in POISONED and (event.stream_version or 0) >= 2:
            out.setdefault(sid, None)
            continue
        out[sid] = fold(out.get(sid), event)
    return out


async def read(worker: WorkerProc, keys: list[str]) -> dict[str, tuple[Any, str | None]]:
    """Each key's value and its ``Streamapp-Stream-Held`` header, from ``worker`` (one
    worker owns every partition); a 503 (restoring, catching up) is asked again."""
    out: dict[str, tuple[Any, str | None]] = {}
    sem = asyncio.Semaphore(32)
    async with aiohttp.ClientSession() as http:

        async def one(key: str) -> None:
            async def answer() -> tuple[Any, str | None] | None:
                async with http.get(f"http://127.0.0.1:{worker.port}/tables/balances/{key}") as r:
                    if r.status == 503:
                        return None
                    assert r.status in (200, 404), (key, r.status, await r.text())
                    body = await r.json() if r.status == 200 else None
                    return body, r.headers.get(HELD_HEADER)

            async with sem:
                out[key] = await until(answer, what=f"{key} answered", stalled_s=60, poll_s=0.2)

        await asyncio.gather(*(one(k) for k in keys))
    return out


async def wait_table(
    worker: WorkerProc, want: dict[str, dict[str, Any] | None], held: set[str]
) -> None:
    """Until every key of ``want`` has its value, the keys of ``held`` with the header
    (the stream is held from version 2) and no other key with it; fails, naming what is
    wrong, once the answers stood still for 60 s."""
    seen: dict[str, tuple[Any, str | None]] = {}

    def wrong() -> dict[str, Any]:
        return {
            k: (seen.get(k), v, k in held)
            for k, v in want.items()
            if seen.get(k) != (v, "2" if k in held else None)
        }

    async def check() -> bool:
        alive([worker])
        seen.update(await read(worker, list(want)))
        return not wrong()

    await until(
        check,
        what=f"{len(want)} streams exact, {len(held)} held",
        progress=lambda: frozen(seen),
        stalled_s=60,
        poll_s=0.5,
        detail=lambda: dict(list(wrong().items())[:5]),
    )


def held_counts(status: dict[str, Any] | None) -> tuple[int, int] | None:
    """The agent's held streams and events in a /status answer (None: no answer)."""
    if status is None:
        return None
    agent = status["agents"]["apply"]
    return agent["held_streams"], agent["held_events"]


async def held_metrics(worker: WorkerProc) -> tuple[float, float] | None:
    """``streamapp_held_streams`` and ``streamapp_held_events`` of agent ``apply`` in
    ``worker``'s /metrics (None: no answer, or the agent is not there)."""
    found: dict[str, float] = {}
    try:
        async with (
            aiohttp.ClientSession(headers=worker.auth) as http,
            http.get(f"http://127.0.0.1:{worker.port}/metrics") as r,
        ):
            text = await r.text()
    except aiohttp.ClientError:
        return None
    for line in text.splitlines():
        for name in ("streamapp_held_streams", "streamapp_held_events"):
            if line.startswith(f'{name}{{agent="apply"}} '):
                found[name] = float(line.rsplit(" ", 1)[1])
    if len(found) < 2:
        return None
    return found["streamapp_held_streams"], found["streamapp_held_events"]


async def wait_held(worker: WorkerProc, streams: int, events: int) -> None:
    """Until ``worker``'s /status and /metrics (``streamapp_held_streams``,
    ``streamapp_held_events``) count ``streams`` held streams holding ``events``; then
    its ``/readyz`` must be ready: held streams are not the worker's health."""
    seen: list[Any] = [None, None]

    async def check() -> bool:
        alive([worker])
        seen[0] = held_counts(await worker.status())
        seen[1] = await held_metrics(worker)
        return seen[0] == (streams, events) and seen[1] == (streams, events)

    await until(
        check,
        what=f"{streams} held streams, {events} held events (/status and /metrics)",
        progress=lambda: tuple(seen),
        stalled_s=60,
        poll_s=0.3,
        detail=lambda: (seen, worker.log_text()[-2000:]),
    )
    async with (
        aiohttp.ClientSession(headers=worker.auth) as http,
        http.get(f"http://127.0.0.1:{worker.port}/readyz") as r,
    ):
        assert r.status == 200, (r.status, await r.text())


async def held_meta(worker: WorkerProc, key: str) -> dict[str, Any]:
    """Key ``key``'s ``?meta=1`` answer, which must say its stream is held, with the
    header; the ``"held"`` object."""
    url = f"http://127.0.0.1:{worker.port}/tables/balances/{key}?meta=1"
    async with aiohttp.ClientSession(headers=worker.auth) as http, http.get(url) as r:
        assert r.status == 200, (key, r.status, await r.text())
        body: dict[str, Any] = await r.json()
        assert r.headers.get(HELD_HEADER) == str(body["held"]["first"]), (r.headers, body)
    held: dict[str, Any] = body["held"]
    assert held["stream"] == key, body
    assert "poison: the handler cannot apply it yet" in held["error"], body
    return held


def verify(worker: WorkerProc, env: dict[str, str], store: str) -> dict[str, Any]:
    """``streamapp verify`` of table ``balances`` against ``worker``'s views: every stream
    of the event store at ``store`` rebuilt from scratch by the (fixed) handler and
    compared, key by key, with the live table; must find every one equal."""
    out = run_watched(
        streamapp_cmd(
            "verify", "-A", APP, "balances", "--url", f"http://127.0.0.1:{worker.port}", "--json"
        ),
        env=app_env(worker.bootstrap, worker.namespace, **(env | {"STREAMAPP_EVENT_STORE": store})),
        cwd=ROOT,
    )
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    result: dict[str, Any] = orjson.loads(out.stdout.splitlines()[-1])
    assert result["differ"] == result["missing"] == 0, result
    return result


async def send(amqp: str, topic: str, events: list[Event]) -> None:
    """Publish ``events`` to RabbitMQ topic ``topic`` (2 partitions) as a producer would."""
    settings = App("held-test-sender", broker="rabbitmq", amqp_url=amqp).settings()
    sink = RabbitSink(settings, {topic: 2})
    await sink.start()
    try:
        messages = [codec.encode(event) for event in events]
        for key, value, headers in messages:
            await sink.publish(topic, value, key=key, headers=headers)
    finally:
        await sink.stop()


async def publish(amqp: str, store: str, topic: str, events: list[Event]) -> None:
    """Append ``events`` to the event store at ``store``, then publish them to RabbitMQ
    topic ``topic`` in the same order: what the app's forwarder does."""
    await append_to_store(store, events)
    await send(amqp, topic, events)


async def wait_killed(worker: WorkerProc) -> None:
    """Until ``worker`` killed itself (``STREAMAPP_TEST_HELD_KILL``: SIGKILL in the middle
    of a release); fails once its log stood still for 60 s with it alive."""
    await until(
        lambda: not worker.alive,
        what="the worker killed in the middle of the release",
        progress=worker.log_size,
        stalled_s=60,
        poll_s=0.2,
    )
    assert worker.proc is not None
    assert worker.proc.returncode == -9, worker.log_text()[-2000:]
