"""Refuse a partition's state when it no longer matches its source, as the partition opens.

A partition's state (its tables, per-stream versions and checkpoint) is derived from its
sources: the event store it replayed (that store's identity and how far it read), the
partition count its keys were split by, and the agent's tables. Its checkpoint records
all three (:class:`~streamapp.tables.checkpoint.Checkpoint`), and so does every changelog
batch. :func:`check_state` runs once the stores are open and restored, before any replay
or live delivery, and raises :class:`~streamapp.errors.StateMismatchError` when

- the checkpoint names another event store (the store was deleted and made again at the
  same URL, or the setting points elsewhere): the state holds rows that store does not,
  and its store position would skip that store's first events;
- its store position is past the store's head (a store restored from an older copy);
- the partition count differs from the topic's (keys would be looked up in the wrong
  partition, or found twice by scans);
- the agent has a table the state was made without: it would stay empty for good for
  what was applied before.

What "the agent has state" means here: the partition's checkpoint exists once its
stores are open and restored. On Kafka the local store is a cache of the changelog, and
the restore has brought the changelog's checkpoint in, so that is state kept locally or
in the changelog. On RabbitMQ and in embedded mode (``STREAMAPP_BROKER=none``) there is
no changelog: the local store is the state (a missing one is rebuilt from the event
store). The memory broker's stores live as long as the broker: no state outlives it.

A checkpoint of an older streamapp records no provenance: it is adopted once, with a
warning, and the provenance written at once. Refusing it would make every upgrade
rebuild every projection (a reset and a full replay) for a mismatch that cannot be
told from it; the position check still refuses the common case of a new, shorter store.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..agents.agent import Agent
from ..errors import APP_REF, StateMismatchError
from ..tables.partition import CHECKPOINT_KEY, META, PartitionTables
from ..topics import TopicSpec
from .lane import Lane

log = logging.getLogger("streamapp.partition")

RESET = f"`streamapp reset -A {APP_REF} --yes` (it removes the app's local state and changelogs)"


@dataclass(frozen=True, slots=True)
class StoreIdentity:
    """The event store a worker reads, as a checkpoint is checked against it."""

    id: str
    url: str
    """The ``event_store`` URL, without a password."""
    head: int
    """The last readable position when asked."""


class _Identified(Protocol):
    async def identity(self) -> StoreIdentity: ...


class Checked(Protocol):
    """What the check reads of a partition task (:class:`~streamapp.engine.task.PartitionTask`;
    a protocol, as the task imports this module)."""

    @property
    def lanes(self) -> Sequence[Lane]: ...
    @property
    def history(self) -> _Identified | None: ...
    @property
    def topic(self) -> TopicSpec: ...
    @property
    def partition(self) -> int: ...
    @property
    def transaction(self) -> object | None: ...


async def check_state(task: Checked) -> None:
    """Refuse (StateMismatchError) or adopt each lane's state of ``task``; then every
    open checkpoint carries this worker's provenance, written with its next commit."""
    store: StoreIdentity | None = None
    for lane in task.lanes:
        tables = lane.tables
        if tables is None:
            continue
        if store is None and task.history is not None:
            store = await task.history.identity()
        _check(lane.agent, tables, task, store)


@dataclass(frozen=True, slots=True)
class _Alone:
    """One agent's state checked outside a task (a standby's): what :func:`_check` reads."""

    topic: TopicSpec
    partition: int
    lanes: Sequence[Lane] = ()
    history: _Identified | None = None
    transaction: object | None = True


def check_tables(
    agent: Agent,
    tables: PartitionTables,
    topic: TopicSpec,
    partition: int,
    store: StoreIdentity | None,
) -> None:
    """The check of one agent's open ``tables`` (a standby copy, restored from its
    changelog): StateMismatchError as a task's open raises it."""
    _check(agent, tables, _Alone(topic, partition), store)


def _check(
    agent: Agent, tables: PartitionTables, task: Checked, store: StoreIdentity | None
) -> None:
    cp = tables.checkpoint
    names = tuple(sorted(t.identity for t in agent.tables))
    partitions = task.topic.partitions
    stamped = cp.advanced(partitions=partitions, tables=names)
    if store is not None:  # checked below when the checkpoint holds a store position
        stamped = stamped.advanced(store=store.id)
    if tables.store.get(META, CHECKPOINT_KEY) is None:
        tables.checkpoint = stamped  # no state yet: nothing to compare
        return
    where = _where(tables, task, agent)
    adopted: list[str] = []
    if cp.partitions is None:
        adopted.append(f"partition count {partitions}")
    elif cp.partitions != partitions:
        raise StateMismatchError(
            f"topic {task.topic.name!r} is declared with {partitions} partitions, but {where} "
            f"was made with {cp.partitions} partitions: its keys belong to other partitions "
            f"now. Declare partitions={cp.partitions} again, or rebuild the state for "
            f"{partitions}: stop every worker of the app, run {RESET}, make the topics with "
            f"{partitions} partitions (on a broker), and start again."
        )
    if cp.tables is None:
        adopted.append(f"tables {list(names)}")
    else:
        added = sorted(set(names) - set(cp.tables))
        if added:  # their spaces, made by this open, go at its close (RocksStore)
            _refuse_new_value_type(agent, added, cp.tables, where)
            _refuse_new_version(agent, added, cp.tables, where)
            raise StateMismatchError(
                f"agent {agent.name!r} declares table(s) {added}, but {where} was made "
                f"without them (tables {list(cp.tables)}): they would stay empty for "
                "everything applied before. Give the new table(s) to an agent of their own "
                f"(a new agent has no state yet), or rebuild this agent's state: stop every "
                f"worker of the app, run `streamapp reset -A {APP_REF} --agent {agent.name} "
                "--yes` (it removes the agent's local state and changelog), and start again."
            )
    if store is not None and cp.history is not None:
        if cp.store is None:
            adopted.append(f"event store {store.id}")
        elif cp.store != store.id:
            raise StateMismatchError(
                f"{where} was made from event store {cp.store}, but setting event_store "
                f"(STREAMAPP_EVENT_STORE) = {store.url} is event store {store.id} (made "
                "again at that URL, or another one): this state would serve rows the store "
                f"does not hold and skip its first positions. Point STREAMAPP_EVENT_STORE "
                f"back at event store {cp.store}, or rebuild the state from this store: "
                f"stop every worker of the app, run {RESET}, and start again."
            )
        if cp.history - 1 > store.head:
            raise StateMismatchError(
                f"{where} has applied event store {store.url} up to position "
                f"{cp.history - 1}, but the store's head is {store.head}: the store lost "
                "events since (restored from an older copy?), and positions it gives again "
                f"would be skipped. Point STREAMAPP_EVENT_STORE back at the store the state "
                f"was made from, or rebuild the state from this store: stop every worker of "
                f"the app, run {RESET}, and start again."
            )
    if adopted:
        log.warning(
            "%s was written by an older streamapp, which did not record what it was made "
            "from: adopted as made from %s",
            where,
            ", ".join(adopted),
        )
    if stamped != cp:  # once: the next open finds it recorded
        tables.store.write({META: {CHECKPOINT_KEY: stamped.encode()}})
    tables.checkpoint = stamped


def _refuse_new_value_type(
    agent: Agent, added: Sequence[str], held: Sequence[str], where: str
) -> None:
    """Refuse a table whose value type changed in place: a new version, never a misread."""
    before = {identity.partition(":")[0]: identity for identity in held}
    for identity in added:
        label, _, tag = identity.partition(":")
        if label in before:
            was = before[label].partition(":")[2] or "JSON (no value_type)"
            now = tag or "JSON (no value_type)"
            name, _, version = label.partition("@v")
            raise StateMismatchError(
                f"agent {agent.name!r}: table {label!r} is declared with values of type "
                f"{now}, but {where} holds values of type {was}. A value type change is a "
                f"new version of the table: declare Table({name!r}, version="
                f"{int(version or 1) + 1}, value_type=...) for an agent of its own beside "
                f"agent {agent.name!r} (docs/changing-a-projection.md), or give back the old "
                "value type"
            )


def _refuse_new_version(
    agent: Agent, added: Sequence[str], held: Sequence[str], where: str
) -> None:
    """Refuse an agent whose table changed version in place, saying how versions go."""
    before = {label.partition("@")[0].partition(":")[0]: label for label in held}
    for label in added:
        name = label.partition("@")[0].partition(":")[0]
        if name in before:
            raise StateMismatchError(
                f"agent {agent.name!r} writes table {label!r}, but {where} holds "
                f"{before[name]!r}, another version of it. A new version is built beside "
                f"the old one by an agent of its own: keep agent {agent.name!r} writing "
                f"{before[name]!r}, add an agent (another name) writing {label!r} on the "
                "same topic, and retire the old version once the new one is active "
                "(docs/changing-a-projection.md)"
            )


def _where(tables: PartitionTables, task: Checked, agent: Agent) -> str:
    """The state as messages name it: its directory and data directory when on disk."""
    path = getattr(tables.store, "path", None)
    restored = " (or the changelog it was restored from)" if task.transaction else ""
    if isinstance(path, Path):
        data_dir = path.parent.parent.parent  # DATA_DIR/app/agent/partition
        return (
            f"the state of agent {agent.name!r} partition {task.partition} in {path} (data "
            f"directory {data_dir}, --data-dir, STREAMAPP_DATA_DIR){restored}"
        )
    return f"the state of agent {agent.name!r} partition {task.partition}{restored}"
