"""The agent contract's harness: what a transport implements to run the one agent suite.

A test declares its app with the harness's :meth:`AgentHarness.new_app` and
:meth:`AgentHarness.name` (a transport may need unique names), registers one agent on it,
then drives it through the harness alone: send records to the agent's source topic,
settle, and read what the transport made of them (committed table values, parked copies,
unsettled records). Nothing in a contract test knows which transport runs it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamapp import App, Event
from streamapp.agent import Agent
from streamapp.kafka import codec


@dataclass(frozen=True)
class Parked:
    """One record read back from a parking destination."""

    value: bytes | None
    key: bytes | None
    headers: dict[str, bytes]

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

    stateless_calls_exact: bool = True
    """True when an agent without tables sees each event exactly once (no redelivery
    after a commit that was not made); a broker only promises at least once."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        """Handler invocations by event id: handlers count themselves here."""
        self.app: App | None = None

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
        assert self.app is not None, "start the app first"
        (agent,) = self.app.agents.values()
        return agent

    @property
    def topic(self) -> str:
        """The agent's source topic."""
        return self.agent.topic.name

    # feeding -------------------------------------------------------------------------
    async def send(self, event: Event) -> None:
        """Send ``event`` to the source topic (binary mode, keyed by its stream id)."""
        key, value, headers = codec.encode(event)
        await self.send_raw(value, key=key, headers=headers)

    @abstractmethod
    async def send_raw(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        """Send any record, CloudEvent or not, to the source topic (in send order per key)."""

    @abstractmethod
    async def settle(self, within_s: float = 30.0) -> bool:
        """Run until every record sent is settled at the source, or ``within_s`` passed;
        True when everything sent is settled."""

    # observing -----------------------------------------------------------------------
    @abstractmethod
    async def unsettled(self) -> int:
        """Records of the source topic not settled yet (committed offsets, acks)."""

    @abstractmethod
    async def table(self, name: str, key: str) -> Any:
        """The committed value of ``key`` in table ``name`` (None when absent)."""

    @abstractmethod
    async def parked(self, topic: str) -> list[Parked]:
        """Every record in parking destination ``topic``, partition by partition, in order."""
