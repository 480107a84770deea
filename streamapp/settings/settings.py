"""One frozen, typed settings object, validated when it is made.

Every component receives the same :class:`Settings`; errors name the setting and the
environment variable that feeds it.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigError
from .event_loop import loop_factory
from .store_url import parse_url

ENV_PREFIX = "STREAMAPP_"
BROKERS = ("kafka", "rabbitmq", "none")
GROUP_SESSIONS = {"kafka": "session_timeout_ms", "rabbitmq": "amqp_session_timeout_ms"}
"""The setting that says when each broker's group calls a silent member gone (the owner's
lease stays below it; ``none`` has no group: the store lock is the lease)."""
GROUP_BEATS = {"rabbitmq": "amqp_heartbeat_ms"}
"""The heartbeat that renews the lease, where the lease must outlast two of them (Kafka's
lease sends its own heartbeats, every third of it)."""
DELAYED_POLICIES = ("immediate", "reject", "relay")
DEFAULT_MEMORY_LIMIT_MB = 256
MIN_MEMORY_LIMIT_MB = 16
"""Below this, each partition store's memtables would flush after a few kilobytes."""
NOT_SETTINGS = frozenset(
    {
        # scripts/services: where and how the local Kafka, RabbitMQ and PostgreSQL run
        "STREAMAPP_SERVICES_HOME",
        "STREAMAPP_KAFKA_PORT",
        "STREAMAPP_KAFKA_CONTROLLER_PORT",
        "STREAMAPP_KAFKA_HEAP",
        "STREAMAPP_KAFKA_TIMEOUT",
        "STREAMAPP_RABBITMQ_PORT",
        "STREAMAPP_RABBITMQ_DIST_PORT",
        "STREAMAPP_RABBITMQ_NODENAME",
        "STREAMAPP_RABBITMQ_TIMEOUT",
        "STREAMAPP_POSTGRES_PORT",
        "STREAMAPP_POSTGRES_TIMEOUT",
        # the test suite: where PostgreSQL answers (tests/conftest.py)
        "STREAMAPP_POSTGRES_DSN",
    }
)
"""``STREAMAPP_`` variables the project's scripts and tests use that are not settings;
every other ``STREAMAPP_`` variable must name a setting (a typo is a ConfigError)."""
NOT_SETTING_PREFIXES = ("STREAMAPP_TEST_",)
"""Families of variables left to the test suite (e.g. ``STREAMAPP_TEST_ARTIFACTS``)."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential back-off: ``attempts`` tries, waits from ``initial_s`` doubling to ``max_s``."""

    attempts: int = 10
    initial_s: float = 0.1
    max_s: float = 2.0

    def delays(self) -> list[float]:
        """The waits between attempts (one fewer than ``attempts``)."""
        out, d = [], self.initial_s
        for _ in range(max(self.attempts - 1, 0)):
            out.append(d)
            d = min(d * 2, self.max_s)
        return out


@dataclass(frozen=True, slots=True)
class Settings:
    """What a worker needs to know. Build with :meth:`from_env` to read ``STREAMAPP_*``."""

    app_id: str
    broker: str = "kafka"
    """The live source: ``kafka``, ``rabbitmq`` or ``none`` (the event store alone)."""
    kafka_bootstrap: str = "127.0.0.1:9092"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    """RabbitMQ (``STREAMAPP_BROKER=rabbitmq``): where the broker answers."""
    amqp_prefetch: int = 500
    """Unacknowledged deliveries a partition queue's consumer may hold (basic.qos)."""
    amqp_partitions: str = ""
    """RabbitMQ: pin the partitions this worker consumes, e.g. ``0,1,5`` (every source
    topic), outside the group; empty (default): the workers of the app share the
    partitions through the membership protocol."""
    amqp_reconnect: bool = True
    """RabbitMQ: after a lost connection, reconnect and resume (deliveries in flight come
    again); off: the worker stops with an error naming the broker (a supervisor restarts
    it)."""
    amqp_heartbeat_ms: int = 500
    """RabbitMQ group: how often a worker says it is alive and what it holds."""
    amqp_session_timeout_ms: int = 3000
    """RabbitMQ group: a worker not heard from for this long is gone; its partitions move."""
    amqp_heartbeat_s: int = 3
    """RabbitMQ: the AMQP connection heartbeat (whole seconds, as AMQP negotiates it). The
    broker closes a connection it has not heard for about this long, and only then moves
    a partition queue's single active consumer to the next consumer: it bounds how long a
    worker cut off from the broker holds queues the group gave to others (60 by default in
    the client; ``docs/rabbitmq.md``: What a network partition costs)."""
    event_store: str = "sqlite:///streamapp-events.db"
    """``sqlite:///relative.db``, ``sqlite:////absolute.db`` or ``postgresql://...``."""
    data_dir: Path = Path("streamapp-data")
    web_host: str = "127.0.0.1"
    web_port: int = 6066
    forwarder_web_port: int = 6067
    """Where ``streamapp forward`` serves ``/healthz``, ``/metrics`` and ``/status`` (on
    ``web_host``, with ``web_token``): 0 picks a free port (logged), -1 serves nothing."""
    web_advertised_url: str | None = None
    """Where other workers reach these views (default ``http://web_host:web_port``)."""
    log_format: str = "text"
    """``text`` lines, or ``json``: one JSON object per line."""
    web_token: str | None = field(default=None, repr=False)
    """Bearer token every view but ``/healthz`` requires (None: none). Never logged."""
    auto_offset_reset: str = "earliest"
    enable_auto_commit: bool = False
    poll_timeout_ms: int = 500
    redeliver_backoff_max_ms: int = 30_000
    """The longest pause before a redelivery: under Redeliver, the pauses before the
    attempts of one failing delivery double from the first (``Redeliver.pause_s``,
    default ``poll_timeout_ms``) up to this (a longer first pause is kept)."""
    delayed_policy: str = "immediate"
    """What ``send(topic, event, delay_s=...)`` does: ``immediate`` sends at once and
    warns; ``reject`` fails the send (the handler's failure policy applies); ``relay``
    holds it in ``{topic}-delay`` until due, and the relay republishes it."""
    max_batch_records: int = 5000
    fetch_max_records: int = 10_000
    """The most records one poll of the Kafka consumer hands out (aiokafka's
    ``max_poll_records``), all partitions together."""
    max_partition_fetch_bytes: int = 8 * 1024 * 1024
    """The most bytes one fetch brings of one partition (aiokafka's, default 1 MiB): a
    partition's next batch arrives in one round trip while its batch runs."""
    fetch_max_bytes: int = 64 * 1024 * 1024
    """The most bytes one fetch brings, all partitions together (the broker caps it at its
    own ``fetch.max.bytes``, 55 MiB by default)."""
    batch_budget_ms: int = 10_000
    max_poll_interval_ms: int = 300_000
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    """Kafka: how often a member tells the group it lives, and so how soon it hears of a
    rebalance another member started: every partition answers 503 from a member's revoke
    to its new assignment, so the group converges within about one interval (3 s, Kafka's
    default, made a standby's warm-up move cost every key 2.5 s of 503s)."""
    rebalance_timeout_ms: int = 60_000
    owner_lease_s: float = 0.0
    """How long a worker answers as owner of its partitions after the group last confirmed
    its membership (Kafka: a heartbeat of its generation; RabbitMQ: its own membership
    heartbeat): past it, its views answer 503 and ``/readyz`` is 503. Below the session
    timeout, so the group never moved a partition while the lease holds; 0 (default):
    two thirds of it (:meth:`owner_lease`)."""
    publish_timeout_s: float = 5.0
    """How long a publish may wait for the broker's confirm (a RabbitMQ confirm, a park, a
    retry or dead-letter copy, a relayed or forwarded event) before it counts as failed,
    outcome unknown: the record is not settled and comes again."""
    control_publish_timeout_s: float = 10.0
    """How long a control record's publish may wait for the broker: the retirement
    ledger's records (on Kafka, at a worker's start and by ``streamapp retire``). Longer
    than ``publish_timeout_s``: a deadline tuned for events must not fail a start."""
    transaction_timeout_s: float = 30.0
    """How long a Kafka partition task's transaction (changelog records, derived events,
    chain copies and offsets) and the start of its transactional writer may take."""
    replication_factor: int = 1
    shutdown_timeout_s: float = 45.0
    store_open_timeout_s: float = 30.0
    table_cache_keys: int = 10_000
    """Committed values each partition store keeps in memory per table, and stream
    versions as many: the handlers' and the stream-version guard's reads of them skip
    RocksDB. A worker holds at most this x (tables + 1) x partitions; 0: no cache.
    Outside ``memory_limit_mb`` (docs/settings.md: Memory)."""
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB
    """RocksDB's memory for the whole worker: one block cache of this size, shared by
    every partition store it opens, with their memtables charged to it (docs/settings.md:
    Memory)."""
    restore_stall_timeout_s: float = 60.0
    standby_replicas: int = 0
    """Kafka: on how many other workers each partition's stores are kept warm from its
    changelog (never on its owner), so that a partition that moves restores only the
    tail (:mod:`streamapp.transports.kafka.standby`)."""
    stall_after_s: float = 30.0
    """A live partition that has events to apply and applied none for this long, while
    its task is not redelivering on purpose (a Redeliver backoff), is stalled: named in
    ``/status``, counted on ``/metrics`` (``streamapp_stalled_partitions``), logged once
    with what it was doing; ``/readyz`` is 503 while every partition of an agent is
    (:mod:`streamapp.engine.stalled`)."""
    loop_stall_warn_ms: int = 500
    """Warn when the event loop did not run for longer than this (a handler that blocks
    it stalls every partition, the group heartbeats and the views): the warning names the
    agent and the record, while the stall lasts and again with its total. 0: off."""
    event_loop: str = "asyncio"
    """The event loop ``streamapp worker`` and ``streamapp forward`` run on: ``asyncio``'s
    own, or ``uvloop`` (the ``uvloop`` extra; level with asyncio's in the bench's
    rounds, see :mod:`streamapp.settings.event_loop`)."""
    gc_threshold: int = 50_000
    """The first-generation threshold of Python's garbage collector while a worker runs
    (``gc.set_threshold``): a batch's records die young instead of filling the oldest
    generation, whose full collections cost the default threshold (700) a quarter of its
    CPU. 0 leaves the interpreter's."""
    startup_retry: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        for f in fields(self):  # App(data_dir="...", poll_timeout_ms="200") as users write it
            given: object = getattr(self, f.name)
            if isinstance(given, str) and str(f.type) in _PARSED:
                object.__setattr__(self, f.name, _parse(f.name, f.type, given))
        self._validate()

    @property
    def group_id(self) -> str:
        """The Kafka consumer group of every worker of this app."""
        return self.app_id

    def owner_lease(self) -> float:
        """Setting ``owner_lease_s``, or its default: two thirds of the group's session
        timeout (:data:`GROUP_SESSIONS`: ``amqp_session_timeout_ms`` on RabbitMQ,
        ``session_timeout_ms`` on Kafka)."""
        if self.owner_lease_s > 0:
            return self.owner_lease_s
        return self._setting_s(GROUP_SESSIONS.get(self.broker, "session_timeout_ms")) * 2 / 3

    def _setting_s(self, name: str) -> float:
        """Setting ``name`` (milliseconds) in seconds."""
        value: int = getattr(self, name)
        return value / 1000

    def owned_partitions(self) -> frozenset[int] | None:
        """The partitions of setting ``amqp_partitions``; None: all of them."""
        text = self.amqp_partitions.strip()
        if not text or text == "all":
            return None
        owned = frozenset(int(p) for p in text.split(","))
        if any(p < 0 for p in owned):
            raise ValueError(text)
        return owned

    @classmethod
    def from_env(cls, app_id: str, env: dict[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``STREAMAPP_<NAME>`` variables, then ``overrides`` on top.

        A ``STREAMAPP_`` variable that names no setting (and is not one of
        :data:`NOT_SETTINGS`) is a ConfigError naming the closest setting; so is an
        unknown name in ``overrides``. ``STREAMAPP_APP_ID`` is ignored: the app id is
        ``app_id``.
        """
        env = dict(os.environ) if env is None else env
        _check_variables(env)
        check_setting_names(overrides)
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is None or f.name in ("app_id", "startup_retry"):
                continue
            if f.name == "web_token" and not raw:  # STREAMAPP_WEB_TOKEN= means none
                continue
            values[f.name] = _parse(f.name, f.type, raw)
        values.update(overrides)
        return cls(app_id=app_id, **values)

    def with_(self, **changes: Any) -> Settings:
        """A validated copy with ``changes`` applied."""
        check_setting_names(changes)
        return replace(self, **changes)

    def _validate(self) -> None:
        def bad(name: str, why: str) -> ConfigError:
            return ConfigError(
                f"setting {name} ({ENV_PREFIX}{name.upper()}) = {getattr(self, name)!r}: {why}"
            )

        if not isinstance(self.app_id, str) or not self.app_id.strip():
            raise ConfigError("setting app_id: the app needs a non-blank name (it is the group id)")
        if self.app_id != self.app_id.strip() or any(c.isspace() for c in self.app_id):
            raise bad("app_id", "must not contain whitespace (it names topics and the group)")
        if self.enable_auto_commit:
            raise bad(
                "enable_auto_commit",
                "auto-commit would commit offsets of records not yet durable in the table; "
                "streamapp commits explicit offsets itself. Set it to false.",
            )
        if self.broker not in BROKERS:
            raise bad("broker", f"must be one of {', '.join(BROKERS)}")
        parse_url(self.event_store)  # raises ConfigError naming the setting
        if self.delayed_policy not in DELAYED_POLICIES:
            raise bad("delayed_policy", f"must be one of {', '.join(DELAYED_POLICIES)}")
        if self.auto_offset_reset not in ("earliest", "latest"):
            raise bad("auto_offset_reset", "must be 'earliest' or 'latest'")
        if not self.kafka_bootstrap.strip():
            raise bad("kafka_bootstrap", "give host:port of a broker")
        if not self.amqp_url.startswith(("amqp://", "amqps://")):
            raise bad("amqp_url", "give amqp://user:password@host:port/vhost")
        try:
            self.owned_partitions()
        except ValueError:
            raise bad(
                "amqp_partitions", "give partition numbers separated by commas, or nothing for all"
            ) from None
        if self.web_token is not None and (
            not self.web_token.strip() or any(c.isspace() for c in self.web_token)
        ):
            raise ConfigError(
                f"setting web_token ({ENV_PREFIX}WEB_TOKEN) must be a non-blank token "
                "without whitespace (its value is not shown)"
            )
        if self.log_format not in ("text", "json"):
            raise bad("log_format", "must be 'text' or 'json'")
        if not 0 <= self.web_port < 65536:
            raise bad("web_port", "must be a TCP port (0 picks a free one)")
        if not -1 <= self.forwarder_web_port < 65536:
            raise bad("forwarder_web_port", "must be a TCP port (0 picks a free one, -1: none)")
        for name in (
            "poll_timeout_ms",
            "redeliver_backoff_max_ms",
            "max_batch_records",
            "fetch_max_records",
            "max_partition_fetch_bytes",
            "fetch_max_bytes",
            "batch_budget_ms",
            "max_poll_interval_ms",
            "session_timeout_ms",
            "heartbeat_interval_ms",
            "rebalance_timeout_ms",
            "replication_factor",
            "amqp_prefetch",
            "amqp_heartbeat_ms",
            "amqp_session_timeout_ms",
            "amqp_heartbeat_s",
            "publish_timeout_s",
            "control_publish_timeout_s",
            "transaction_timeout_s",
            "shutdown_timeout_s",
            "store_open_timeout_s",
            "restore_stall_timeout_s",
            "stall_after_s",
        ):
            if getattr(self, name) <= 0:
                raise bad(name, "must be positive")
        if self.amqp_heartbeat_ms * 3 > self.amqp_session_timeout_ms:
            raise bad("amqp_session_timeout_ms", "must be at least 3 x amqp_heartbeat_ms")
        self._validate_amqp_heartbeat(bad)
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise bad("heartbeat_interval_ms", "must be below session_timeout_ms")
        self._validate_lease(bad)
        if self.batch_budget_ms * 2 > self.rebalance_timeout_ms:
            raise bad(
                "batch_budget_ms",
                "must be at most half of rebalance_timeout_ms, so a revoked partition can "
                "finish its batch and flush inside the rebalance",
            )
        if self.batch_budget_ms * 2 > self.max_poll_interval_ms:
            raise bad("batch_budget_ms", "must be at most half of max_poll_interval_ms")
        if self.shutdown_timeout_s <= self.rebalance_timeout_ms / 2000:
            raise bad(
                "shutdown_timeout_s",
                "must exceed half of rebalance_timeout_ms (the time a partition may take to "
                "finish its batch when it is revoked), or a stopping worker cannot drain",
            )
        if self.loop_stall_warn_ms < 0:
            raise bad("loop_stall_warn_ms", "must be 0 (off) or more (milliseconds)")
        loop_factory(self.event_loop)  # an unknown loop, or uvloop not installed
        if self.gc_threshold < 0:
            raise bad("gc_threshold", "must be 0 (the interpreter's) or more (allocations)")
        if self.standby_replicas < 0:
            raise bad("standby_replicas", "must be 0 (no standbys) or more (workers)")
        if self.table_cache_keys < 0:
            raise bad("table_cache_keys", "must be 0 (no cache) or more")
        if self.memory_limit_mb < MIN_MEMORY_LIMIT_MB:
            raise bad(
                "memory_limit_mb",
                f"must be at least {MIN_MEMORY_LIMIT_MB} (MB): RocksDB's block cache and "
                "memtables of every partition store of this worker share it",
            )
        if self.startup_retry.attempts < 1:
            raise ConfigError("setting startup_retry.attempts must be at least 1")

    def _validate_lease(self, bad: Callable[[str, str], ConfigError]) -> None:
        if self.owner_lease_s < 0:
            raise bad("owner_lease_s", "must be 0 (two thirds of the session timeout) or more")
        session, beats = GROUP_SESSIONS.get(self.broker), GROUP_BEATS.get(self.broker)
        if session is not None and self.owner_lease_s >= self._setting_s(session):
            raise bad(
                "owner_lease_s",
                f"must be below {session} ({self._setting_s(session):g} s): the group may "
                "move a partition once the session timed out, and the lease must have "
                "lapsed by then",
            )
        if beats is not None and 0 < self.owner_lease_s <= 2 * self._setting_s(beats):
            raise bad(
                "owner_lease_s",
                f"must exceed twice {beats} ({self._setting_s(beats):g} s), or the lease "
                "lapses when one heartbeat is late",
            )

    def _validate_amqp_heartbeat(self, bad: Callable[[str, str], ConfigError]) -> None:
        if self.amqp_heartbeat_s > 65535:  # a short in AMQP's connection.tune
            raise bad("amqp_heartbeat_s", "must be at most 65535 (seconds)")
        given = amqp_url_heartbeat(self.amqp_url)
        if given is not None and given != str(self.amqp_heartbeat_s):
            raise bad(
                "amqp_heartbeat_s",
                f"is {self.amqp_heartbeat_s}, but amqp_url says heartbeat={given}: remove "
                "heartbeat from the URL (the setting applies it) or give both the same value",
            )


def amqp_url_heartbeat(url: str) -> str | None:
    """The ``heartbeat`` query parameter of an AMQP URL, if it has one."""
    return parse_qs(urlsplit(url).query).get("heartbeat", [None])[-1]


_SETTABLE = tuple(f.name for f in fields(Settings) if f.name != "app_id")
_FROM_ENV = {ENV_PREFIX + name.upper(): name for name in _SETTABLE if name != "startup_retry"}
_FIXED = ("acks", "idempotence")
"""Producer options that are no setting: streamapp's Kafka producers always use
``acks=all`` with idempotence (see :mod:`streamapp.transports.kafka.sink`)."""


def check_setting_names(names: Iterable[str]) -> None:
    """ConfigError for the first name that is not a setting, naming the closest one."""
    for name in names:
        if name in _SETTABLE:
            continue
        if name == "app_id":
            raise ConfigError("setting app_id is the App's first argument: App('my-app', ...)")
        raise ConfigError(f"unknown setting {name!r}{_hint(name)}")


def _check_variables(env: Mapping[str, str]) -> None:
    for var in env:
        if (
            not var.startswith(ENV_PREFIX)
            or var in _FROM_ENV
            or var in NOT_SETTINGS
            or var.startswith(NOT_SETTING_PREFIXES)
            or var == ENV_PREFIX + "APP_ID"
        ):
            continue
        name = var[len(ENV_PREFIX) :].lower()
        if name == "startup_retry":
            raise ConfigError(
                f"setting startup_retry cannot be read from {var}; pass "
                "startup_retry=Backoff(...) to App or Settings"
            )
        raise ConfigError(
            f"environment variable {var} names no setting{_hint(name, env=True)} "
            f"(streamapp reads every {ENV_PREFIX} variable: unset or rename it if it is "
            "not meant for streamapp)"
        )


def _hint(name: str, *, env: bool = False) -> str:
    if any(word in name.lower() for word in _FIXED):
        return (
            "; streamapp's Kafka producers always publish with acks=all and idempotence "
            "(no setting weakens that)"
        )
    close = difflib.get_close_matches(name.lower(), _SETTABLE, n=1)
    if not close:
        return "; the settings are the fields of streamapp.Settings (docs/settings.md)"
    if env:
        return f"; did you mean {ENV_PREFIX}{close[0].upper()} (setting {close[0]})?"
    return f"; did you mean {close[0]!r}?"


_PARSED = frozenset({"int", "float", "bool", "Path"})
"""The declared types a setting given as text is converted to (as from its variable)."""


def _parse(name: str, type_name: Any, raw: str) -> Any:
    kind = str(type_name)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if kind == "Path":
            return Path(raw)
    except ValueError:
        raise ConfigError(
            f"setting {name}: {ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind}"
        ) from None
    return raw
