"""streamapp: event-sourced projections over Kafka with exactly-once RocksDB state."""

from .agent import Agent, TopicSpec
from .app import App
from .errors import (
    ConcurrencyError,
    ConfigError,
    DecodeError,
    MissingTopicError,
    PublishError,
    Refuse,
    StoreLockedError,
    StreamappError,
)
from .events import Event
from .history import FromEventStore
from .outcomes import FailurePolicy, Outcome, Park, Redeliver, Retry
from .outputs import Send
from .settings import Backoff, Settings
from .tables.reads import ReadView
from .tables.table import JsonCodec, Table, TableView

__all__ = [
    "Agent",
    "App",
    "Backoff",
    "ConcurrencyError",
    "ConfigError",
    "DecodeError",
    "Event",
    "FailurePolicy",
    "FromEventStore",
    "JsonCodec",
    "MissingTopicError",
    "Outcome",
    "Park",
    "PublishError",
    "ReadView",
    "Redeliver",
    "Refuse",
    "Retry",
    "Send",
    "Settings",
    "StoreLockedError",
    "StreamappError",
    "Table",
    "TableView",
    "TopicSpec",
]
