"""The agent contract's harness: what a transport implements to run the one agent suite.

A test declares its app with the harness's :meth:`AgentHarness.new_app` and
:meth:`AgentHarness.name` (a transport may need unique names), registers its agents on
it, then drives it through the harness alone: send records to a source topic (the first
agent's by default), settle, and read what the transport made of them (committed table
values, parked copies, derived events, unsettled records). Nothing in a contract test
knows which transport runs it.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from streamapp import App, Event
from streamapp.agents.agent import Agent
from streamapp.codecs import kafka as codec
from tests.support.waits import frozen, until


@dataclass(frozen=True)
class Parked:
    """One record read back from a parking destination."""

    value: bytes | None
    key: bytes | None
    headers: dict[str, bytes]
    partition: int = -1
    """The partition it is in (-1: the transport does not say)."""

    @property
    def reason(self) -> str:
        return self.headers["streamapp-park-reason"].decode()

    @property
    def source(self) -> str:
        """``topic/partition/position`` of the original."""
        return self.headers["streamapp-source"].decode()


class AgentHarness(ABC):
    """One transport running one app with one agent, as the contract drives it."""

    redeliver_pause_s: float | None = None
    """The ``Redeliver(pause_s=...)`` a test should use here: long enough on a real
    broker to see other partitions flow meanwhile, nothing in memory."""

    early_settles: list[str]
    """Settles of a partition with tables made before its store held them, where the
    harness can watch the moment of each settle in the process (Kafka); empty elsewhere."""

    settles_watched: int
    """Settles so checked (0 where the harness cannot watch them)."""

    stateless_calls_exact: bool = True
    """True when an agent without tables sees each event exactly once (no redelivery
    after a commit that was not made); a broker only promises at least once."""

    due_order_kept: bool = True
    """True when the relay republishes a partition's due retry copies in due order (one
    loop per partition: Kafka, memory); RabbitMQ's relay sends each held copy on its own
    once due, so copies due at about the same time may cross."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        """Handler invocations by event id: handlers count themselves here."""
        self.early_settles = []
        self.settles_watched = 0
        self.app: App | None = None
        self.narrowed: set[str] = set()
        """Topics (dead-letter, parking) that :meth:`start` makes with one partition
        (one queue) instead of the app's count, where the transport allows it."""

    # declaring and running the app ------------------------------------------------
    @abstractmethod
    def new_app(self, **settings: Any) -> App:
        """A fresh app for this test, with ``settings`` (e.g. ``batch_budget_ms``)."""

    @abstractmethod
    def name(self, base: str) -> str:
        """The transport's name for topic ``base`` in this test (unique on a broker)."""

    @abstractmethod
    async def start(self, app: App) -> None:
        """Create what the app needs and start running its agent."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop everything started; safe to call twice or before start."""

    @property
    def agent(self) -> Agent:
        """The app's first agent."""
        assert self.app is not None, "start the app first"
        return next(iter(self.app.agents.values()))

    @property
    def topic(self) -> str:
        """The first agent's source topic."""
        return self.agent.topic.name

    def partitions(self, topic: str) -> int:
        """The declared partition count of ``topic``."""
        assert self.app is not None, "start the app first"
        return self.app.topics[topic].partitions

    # feeding -------------------------------------------------------------------------
    async def send(self, event: Event, *, topic: str | None = None) -> None:
        """Send ``event`` to ``topic`` (default: the first agent's; binary mode, keyed by
        its stream id)."""
        key, value, headers = codec.encode(event)
        await self.send_raw(value, key=key, headers=headers, topic=topic)

    @abstractmethod
    async def send_raw(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        topic: str | None = None,
    ) -> None:
        """Send any record, CloudEvent or not, to ``topic`` (default: the first agent's),
        in send order per key."""

    @abstractmethod
    async def position_of(self, i: int) -> int:
        """The position the transport gave the ``i``-th record sent (0-based, ``send`` and
        ``send_raw`` alike, counting only records the transport took): the position its
        parked copy names in ``streamapp-source``. A broker's offset in the record's
        partition; the event store's global position."""

    @abstractmethod
    async def value_of(self, i: int) -> bytes | None:
        """The value the transport holds for the ``i``-th record sent (as
        :meth:`position_of` counts): the bytes its parked copy must carry unchanged."""

    def parked_event(self, parked: Parked) -> Event:
        """The CloudEvent of a parked copy, decoded as this transport's records are (a
        broker: binary mode, ``ce_`` headers)."""
        return codec.decode(parked.key, parked.value, list(parked.headers.items()))

    @abstractmethod
    async def settle(self, stalled_s: float = 30.0) -> bool:
        """Run until every record sent is settled at the source; True then. A broker's
        harness fails (``Stalled``) once nothing moved (:meth:`progress`) for
        ``stalled_s``; the memory broker's answers False when records are stuck."""

    async def progress(self) -> Hashable:
        """What moves while the transport works: records not settled, handler calls."""
        return (await self.unsettled(), sum(self.calls.values()))

    # observing -----------------------------------------------------------------------
    @abstractmethod
    async def unsettled(self) -> int:
        """Records of the source topics not settled yet (committed offsets, acks)."""

    @abstractmethod
    async def table(self, name: str, key: str) -> Any:
        """The committed value of ``key`` in table ``name`` (None when absent)."""

    @abstractmethod
    async def parked(self, topic: str) -> list[Parked]:
        """Every record in parking destination ``topic``, partition by partition, in order."""

    async def records(self, topic: str) -> list[Parked]:
        """Every record of ``topic`` a consumer downstream sees (a broker: committed only),
        partition by partition, in order: e.g. the derived events an agent sent."""
        return await self.parked(topic)

    async def crossed(self, topic: str) -> list[Parked]:
        """Every record that went through ``topic`` since :meth:`start`, even one consumed
        and acked since (a retry queue's copies on RabbitMQ), partition by partition, in
        order (a log keeps them: :meth:`records`)."""
        return await self.records(topic)

    def clock_ms(self) -> float:
        """The transport's time (epoch ms), the one ``x-deliver-at`` is written in."""
        return time.time() * 1000

    @abstractmethod
    def metric(self, name: str, agent: str) -> float | None:
        """The worker's counter ``name`` for ``agent`` on /metrics (None: absent)."""

    async def until(
        self, check: Callable[[], bool | Awaitable[bool]], what: str, stalled_s: float = 30.0
    ) -> None:
        """Run until ``check`` (sync or async) holds, polled; fail naming ``what`` once
        nothing moved (:meth:`progress`) for ``stalled_s``."""
        await until(check, what=what, progress=self.progress, stalled_s=stalled_s, poll_s=0.05)


def counter(text: str, name: str, agent: str) -> float | None:
    """Counter ``name`` (``_total`` added) for ``agent`` in Prometheus text (None: absent)."""
    prefix = f'{name}_total{{agent="{agent}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


async def read_view(http: aiohttp.ClientSession, port: int | None, name: str, key: str) -> Any:
    """The committed value of ``key`` in table ``name`` over a worker's HTTP view (None:
    absent); waits while the view answers 503 (restoring, rebalancing) and the worker's
    partitions move (its /status)."""
    url = f"http://127.0.0.1:{port}/tables/{name}/{quote(key, safe='')}"

    async def answer() -> tuple[Any] | None:
        async with http.get(url) as r:
            if r.status == 200:
                return (await r.json(),)
            if r.status == 404:
                body = await r.json()
                assert "not found" in body["error"], body
                return (None,)
            assert r.status == 503, (r.status, await r.text())
            return None

    async def progress() -> bytes:
        async with http.get(f"http://127.0.0.1:{port}/status") as r:
            return frozen((await r.json())["partitions"] if r.status == 200 else r.status)

    what = f"table {name!r} key {key!r} answered, not 503"
    (value,) = await until(answer, what=what, progress=progress, stalled_s=30)
    return value
