"""streamapp: event-sourced projections over Kafka with exactly-once RocksDB state."""

import importlib
import sys
import warnings
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

from .agents.agent import Agent
from .agents.history import FromEventStore
from .agents.outputs import Send
from .agents.typed import EventTypes
from .app import App
from .errors import (
    AgentRefusedError,
    BrokerUnavailableError,
    ConcurrencyError,
    ConfigError,
    DataError,
    DecodeError,
    DuplicateEventError,
    EventStoreUnavailableError,
    FencedError,
    ForeignKeyError,
    GroupByError,
    InvalidEventError,
    LockLostError,
    MissingTopicError,
    OutputError,
    PhaseTransitionError,
    PublishError,
    Refuse,
    ReplayError,
    ReservedNameError,
    ResetRefusedError,
    RetireRefusedError,
    ShutdownTimeoutError,
    SourceError,
    StateMismatchError,
    StoreBehindError,
    StoreClosedError,
    StoreCorruptError,
    StoreError,
    StoreFormatError,
    StoreIOError,
    StoreLockedError,
    StreamappError,
    TableUnavailableError,
    UnknownAgentError,
)
from .events import Event
from .failures.outcomes import FailurePolicy, Outcome, Park, Redeliver, Retry
from .settings.settings import Backoff, Settings
from .tables.reads import ReadView
from .tables.table import JsonCodec, Table, TableView
from .topics import TopicSpec

__all__ = [
    "Agent",
    "AgentRefusedError",
    "App",
    "Backoff",
    "BrokerUnavailableError",
    "ConcurrencyError",
    "ConfigError",
    "DataError",
    "DecodeError",
    "DuplicateEventError",
    "Event",
    "EventStoreUnavailableError",
    "EventTypes",
    "FailurePolicy",
    "FencedError",
    "ForeignKeyError",
    "FromEventStore",
    "GroupByError",
    "InvalidEventError",
    "JsonCodec",
    "LockLostError",
    "MissingTopicError",
    "Outcome",
    "OutputError",
    "Park",
    "PhaseTransitionError",
    "PublishError",
    "ReadView",
    "Redeliver",
    "Refuse",
    "ReplayError",
    "ReservedNameError",
    "ResetRefusedError",
    "RetireRefusedError",
    "Retry",
    "Send",
    "Settings",
    "ShutdownTimeoutError",
    "SourceError",
    "StateMismatchError",
    "StoreBehindError",
    "StoreClosedError",
    "StoreCorruptError",
    "StoreError",
    "StoreFormatError",
    "StoreIOError",
    "StoreLockedError",
    "StreamappError",
    "Table",
    "TableUnavailableError",
    "TableView",
    "TopicSpec",
    "UnknownAgentError",
]


MOVED = {
    "agent": "agents.agent",
    "binding": "agents.binding",
    "catchup_progress": "catchup.progress",
    "cli.replay": "cli.parked",
    "engine.build": "engine.lane_build",
    "engine.collector": "worker",
    "engine.pace": "engine.backoff",
    "engine.window": "transports.kafka.window",
    "eventstore.pgconn": "eventstore.postgres.session",
    "eventstore.pglocks": "eventstore.postgres.locks",
    "eventstore.sqlite_forwarder": "eventstore.sqlite.forwarder",
    "eventstore.sqlite_schema": "eventstore.sqlite.schema",
    "forwarder": "catchup.forwarder",
    "history": "agents.history",
    "kafka": "transports.kafka",
    "loop": "settings.event_loop",
    "outcomes": "failures.outcomes",
    "outputs": "agents.outputs",
    "partitioner": "topics",
    "rabbitmq": "transports.rabbitmq",
    "repartition": "agents.group_by",
    "republish": "failures.republish",
    "reserved": "records",
    "reset": "cli.reset",
    "retire": "cli.retire",
    "retired": "versions.retired",
    "retirement": "versions.ledger",
    "retry_chain": "failures.retry_chain",
    "startup": "transports.startup",
    "storeonly": "transports.embedded",
    "storeurl": "settings.store_url",
    "tables.memory": "tables.rocksdb.cache",
    "tables.status": "tables.rocksdb.status_codes",
    "transport": "transports.base",
    "typed": "agents.typed",
    "version": "_version",
    "version_states": "versions.states",
    "web.forward": "web.owner",
    "web.routes": "web.versions",
}
"""Modules that moved to a package of their concept (docs/architecture.md), old name (under
``streamapp.``) to new. Importing an old name gives the new module, with a
DeprecationWarning; these names go in the next release. ``streamapp.memory`` (now
:mod:`streamapp.testing`) stays a package of its own, without a warning, for one release."""


class _MovedLoader(Loader):
    """Hands the module at its new place out under its former name too."""

    def __init__(self, new: str) -> None:
        self.new = new
        self.own_spec: ModuleSpec | None = None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}: import it from there ({spec.name} goes in "
            "the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The new module ran when it was imported. The import system has just set its
        ``__spec__`` to the former name's: put its own back, or its relative imports
        would see ``__package__ != __spec__.parent`` (an ImportWarning) from now on."""
        module.__spec__ = self.own_spec


class _MovedFinder(MetaPathFinder):
    """Finds ``streamapp.<old>`` (and what is under a moved package) at its new place."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> ModuleSpec | None:
        if not fullname.startswith("streamapp."):
            return None
        old = fullname.removeprefix("streamapp.")
        head, _, rest = old.partition(".")
        new = MOVED.get(old) or (MOVED[head] + "." + rest if rest and head in MOVED else None)
        if new is None:
            return None
        return ModuleSpec(fullname, _MovedLoader("streamapp." + new))


sys.meta_path.insert(0, _MovedFinder())
