"""The HTTP face of ``streamapp forward``: ``/healthz``, ``/metrics`` and ``/status``.

The forwarder runs as a process of its own, outside any worker, so it serves its own
metrics: events published, lag behind the store head (in events, and in seconds: the
age of the oldest event not published), rate, consecutive failures,
whether it holds the store's forwarder lock, its checkpoint and the store head. The
head is read from the store at each scrape (the lag holds while idle); ``/status`` is the
same as JSON. The worker's middlewares apply: the bearer token of setting ``web_token``
(``/healthz`` open) and JSON errors.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..catchup.forwarder import Forwarder
from . import security
from .metrics import CONTENT_TYPE
from .responses import json_response


@dataclass(frozen=True, slots=True)
class ForwarderSnapshot:
    """What one forwarder reports at one moment (``None``: not known yet)."""

    forwarder: str
    topics: list[str]
    lock_held: bool
    published: int
    lag: int | None
    lag_s: float | None
    """Age of the oldest store event not published (0 when caught up): see :func:`lag_s`."""
    rate: float
    consecutive_failures: int
    checkpoint_position: int | None
    store_head: int | None


async def snapshot(forwarder: Forwarder) -> ForwarderSnapshot:
    """``forwarder``'s figures, with the store head read now (the last known if it fails)."""
    try:
        head: int | None = await forwarder.store.head()
    except Exception:  # the store is down: the forwarder logs it; report what is known
        head = None
    position = forwarder.position
    lag = forwarder.lag
    if head is not None and position is not None:
        lag = max(0, head - (position - 1))
    return ForwarderSnapshot(
        forwarder=forwarder.name,
        topics=list(forwarder.topics),
        lock_held=forwarder.holding,
        published=forwarder.forwarded,
        lag=lag,
        lag_s=await lag_s(forwarder, lag),
        rate=forwarder.rate,
        consecutive_failures=forwarder.failures,
        checkpoint_position=position,
        store_head=head,
    )


async def lag_s(forwarder: Forwarder, lag: int | None) -> float | None:
    """The age of the oldest store event ``forwarder`` has not published: 0 with no lag;
    else read at the scrape (one row at its checkpoint, nothing on the publishing path).
    The store keeps no append time, so the age is the event's CloudEvents ``time`` (set
    when it is made, by :meth:`~streamapp.Event.create` unless given: for an outbox, when
    it was appended), never below 0 nor below how long this forwarder has held it
    unpublished on its own monotonic clock (another host's clock may lag). None: not
    known (no lag known, the store does not answer)."""
    if lag is None or forwarder.position is None:
        return None
    if lag == 0:
        return 0.0
    pending = forwarder.pending_since
    age = 0.0 if pending is None else time.monotonic() - pending
    try:
        rows = await forwarder.store.read_all(forwarder.position, 1)
        stamp = rows[0].event().time if rows else None
        if stamp:
            made = datetime.fromisoformat(stamp)
            if made.tzinfo is None:
                made = made.replace(tzinfo=UTC)
            age = max(age, time.time() - made.timestamp())
    except Exception:  # the store is down, or a time that does not parse: the floor
        pass
    return age


def render(snap: ForwarderSnapshot) -> bytes:
    """``snap`` in the Prometheus text format; unknown figures are left out."""
    labels = ["forwarder"]
    value = [snap.forwarder]

    def gauge(name: str, doc: str, figure: float | None) -> Metric | None:
        if figure is None:
            return None
        family = GaugeMetricFamily(f"streamapp_forwarder_{name}", doc, labels=labels)
        family.add_metric(value, figure)
        return family

    published = CounterMetricFamily(
        "streamapp_forwarder_published",
        "Store events published to every topic and checkpointed, since the process started.",
        labels=labels,
    )
    published.add_metric(value, snap.published)
    families: list[Metric | None] = [
        published,
        gauge("lag_events", "Store events not published yet (store head - checkpoint).", snap.lag),
        gauge(
            "lag_seconds",
            "Age of the oldest store event not published yet, from its CloudEvents time "
            "(0 when caught up; docs/operations.md).",
            snap.lag_s,
        ),
        gauge(
            "rate_events_per_second",
            "Events published per second over the last summary interval.",
            snap.rate,
        ),
        gauge(
            "consecutive_failures",
            "Failed publishes and producer starts since the last confirmed chunk.",
            snap.consecutive_failures,
        ),
        gauge("lock_held", "1 while this forwarder holds the store's lock.", int(snap.lock_held)),
        gauge(
            "checkpoint_position",
            "The checkpoint: the next store position to publish.",
            snap.checkpoint_position,
        ),
        gauge("store_head", "The store's last position.", snap.store_head),
    ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed([f for f in families if f is not None]))
    return generate_latest(registry)


class _Fixed(Collector):
    """A collector of families computed before the scrape (the head is read async)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def make_app(forwarder: Forwarder, token: str | None) -> web.Application:
    """The aiohttp application of one forwarder process."""

    async def healthz(request: web.Request) -> web.Response:
        return json_response({"status": "ok", "forwarder": forwarder.name})

    async def metrics(request: web.Request) -> web.Response:
        body = render(await snapshot(forwarder))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def status(request: web.Request) -> web.Response:
        return json_response(asdict(await snapshot(forwarder)))

    app = web.Application(middlewares=security.middlewares(token))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", status)
    return app
