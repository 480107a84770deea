"""The agent contract over the in-memory broker: the same partition task, in one loop."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamapp import App
from streamapp.engine.delivery import Message
from streamapp.memory import MemoryBroker, StuckRecordsError

from .harness import AgentHarness, Parked


class MemoryHarness(AgentHarness):
    """``settle`` is one :meth:`MemoryBroker.process` round (bounded by its attempts)."""

    redeliver_pause_s = None
    stateless_calls_exact = True

    def __init__(self) -> None:
        super().__init__()
        self._broker: MemoryBroker | None = None
        self._batch_budget_s = 60.0
        self._sent: list[Message] = []

    def new_app(self, **settings: Any) -> App:
        budget_ms = settings.pop("batch_budget_ms", None)
        if budget_ms is not None:
            self._batch_budget_s = budget_ms / 1000
        return App("contract-memory", **settings)

    def name(self, base: str) -> str:
        return base

    async def start(self, app: App) -> None:
        self.app = app
        self._broker = MemoryBroker(app, batch_budget_s=self._batch_budget_s)

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

    async def settle(self, within_s: float = 30.0) -> bool:
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
        return [Parked(r.value, r.key, dict(r.headers)) for r in self.broker.records(topic)]
