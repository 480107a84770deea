"""What a partition task reads of the settings, and the check of the agents it runs
(once per topic and source, by :class:`~streamapp.engine.factory.TaskFactory`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..agents.agent import Agent
from ..errors import ConfigError
from ..failures.outcomes import FailurePolicy, Redeliver, Retry
from ..settings.settings import Settings


@dataclass(frozen=True, slots=True)
class TaskConfig:
    """The settings a task reads (see :class:`~streamapp.settings.Settings`)."""

    max_batch_records: int = 5000
    batch_budget_s: float = 10.0
    redeliver_pause_s: float = 0.5
    redeliver_backoff_max_s: float = 30.0
    """Pauses before redeliveries of one delivery double up to this."""
    close_budget_s: float = 30.0
    policy_pauses: bool = True
    """Honour ``Redeliver(pause_s=...)`` and ``Retry(intervals=...)``; the memory broker
    retries at once instead."""
    delayed_policy: str = "immediate"
    """What ``send(..., delay_s=...)`` does (setting ``delayed_policy``)."""
    clock: Callable[[], float] = time.time
    """Seconds since the epoch: when retry copies are due (the memory broker's runs
    ahead through back-offs)."""
    replay_on_open: bool = False
    """Replay the event store from the checkpoint's store position at every open, caught
    up or not: RabbitMQ keeps no changelog, so a partition that was away may have been
    applied by another worker meanwhile (live deliveries carrying their store position,
    :data:`~streamapp.engine.delivery.STORE_POSITION_HEADER`, keep that replay short)."""
    store_is_source: bool = False
    """The event store is the only source (``STREAMAPP_BROKER=none``): every lane with
    tables catches up from it before it is live, ``history=`` or not."""

    @classmethod
    def from_settings(cls, settings: Settings) -> TaskConfig:
        return cls(
            max_batch_records=settings.max_batch_records,
            batch_budget_s=settings.batch_budget_ms / 1000,
            redeliver_pause_s=settings.poll_timeout_ms / 1000,
            redeliver_backoff_max_s=settings.redeliver_backoff_max_ms / 1000,
            close_budget_s=settings.rebalance_timeout_ms / 2000,
            delayed_policy=settings.delayed_policy,
        )

    def first_pause_s(self, policy: FailurePolicy) -> float:
        """The pause before the first redelivery under ``policy``."""
        if isinstance(policy, Redeliver) and policy.pause_s is not None and self.policy_pauses:
            return policy.pause_s
        return self.redeliver_pause_s


def check_agents(name: str, agents: Sequence[Agent], *, sends: bool, encodes: bool) -> None:
    """Refuse (ConfigError) agents a task of partition ``name`` cannot run: not of one
    topic, or sending (derived events, retry copies) where the source has no broker to
    send to (``sends``: a transaction or a publish; ``encodes``: an encoder)."""
    if not agents or len({a.topic for a in agents}) != 1:
        raise ConfigError(f"{name}: a partition task runs the agents of one topic")
    senders = [a.name for a in agents if a.sinks]
    if senders and (not sends or not encodes):
        raise ConfigError(
            f"{name}: agent(s) {senders} send derived events, but this source has no "
            "broker to send them to"
        )
    chained = [a.name for a in agents if isinstance(a.on_failure, Retry)]
    if chained and not sends:
        raise ConfigError(
            f"{name}: agent(s) {chained} use on_failure=Retry(...), but this source has "
            "no broker for the retry and dead-letter topics: run the app on kafka or rabbitmq"
        )
