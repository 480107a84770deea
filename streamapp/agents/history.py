"""Where an agent's history comes from before it goes live (catch-up then live)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FromEventStore:
    """The agent replays its partitions from the event store, then hands over to live.

    ``url`` names the store; None means the ``event_store`` setting
    (``STREAMAPP_EVENT_STORE``). The forwarder (``streamapp forward``) publishes that
    store's events to the agent's topic.
    """

    url: str | None = None


History = FromEventStore
"""Every kind of history source an agent may declare (one kind today)."""
