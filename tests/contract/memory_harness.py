"""The agent contract over the in-memory broker: the same partition task, in one loop."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from streamapp import App
from streamapp.records import DeliveryRecord
from streamapp.testing import MemoryBroker, StuckRecordsError
from streamapp.web.metrics import WorkerMetrics

from .harness import AgentHarness, Parked, counter


class MemoryHarness(AgentHarness):
    """``settle`` is one :meth:`MemoryBroker.process` round (bounded by its attempts)."""

    redeliver_pause_s = None
    stateless_calls_exact = True

    def __init__(self) -> None:
        super().__init__()
        self._broker: MemoryBroker | None = None
        self._batch_budget_s = 60.0
        self._sent: list[DeliveryRecord] = []
        self.metrics = WorkerMetrics()

    def new_app(self, **settings: Any) -> App:
        budget_ms = settings.pop("batch_budget_ms", None)
        if budget_ms is not None:
            self._batch_budget_s = budget_ms / 1000
        return App("contract-memory", **settings)

    def name(self, base: str) -> str:
        return base

    async def start(self, app: App) -> None:
        self.app = app
        self._broker = MemoryBroker(app, batch_budget_s=self._batch_budget_s, metrics=self.metrics)

    async def stop(self) -> None:
        self._broker = None

    @property
    def broker(self) -> MemoryBroker:
        assert self._broker is not None, "start the app first"
        return self._broker

    async def send_raw(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        topic: str | None = None,
    ) -> None:
        record = self.broker.send_raw(topic or self.topic, value, key=key, headers=headers)
        self._sent.append(record)

    async def position_of(self, i: int) -> int:
        return self._sent[i].position

    async def value_of(self, i: int) -> bytes | None:
        return self._sent[i].value

    async def settle(self, stalled_s: float = 30.0) -> bool:
        try:
            await self.broker.process()  # bounded by max_attempts per record
        except StuckRecordsError:
            return False
        return await self.unsettled() == 0

    async def unsettled(self) -> int:
        assert self.app is not None
        return sum(self.broker.pending(t) for t in self.app.sources)

    async def table(self, name: str, key: str) -> Any:
        return self.broker.table(name).get(key)

    async def parked(self, topic: str) -> list[Parked]:
        if topic not in self.broker.topics:
            return []
        return [
            Parked(r.value, r.key, dict(r.headers), r.partition) for r in self.broker.records(topic)
        ]

    def metric(self, name: str, agent: str) -> float | None:
        return counter(self.metrics.render().decode(), name, agent)

    def clock_ms(self) -> float:
        """The broker's clock: :meth:`MemoryBroker.process` moves it through back-offs."""
        return self.broker.clock() * 1000

    async def until(
        self, check: Callable[[], bool | Awaitable[bool]], what: str, stalled_s: float = 30.0
    ) -> None:
        """One :meth:`MemoryBroker.process` round runs everything that can run (back-offs
        fast-forwarded), so the state is final once it returns: no waiting."""
        await self.broker.process()
        held = check()
        assert await held if inspect.isawaitable(held) else held, (
            f"not {what} after MemoryBroker.process()"
        )
