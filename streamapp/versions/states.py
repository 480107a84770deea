"""Table version states from a snapshot of the members directory (pure, no I/O).

Every worker says, in its directory record (Kafka's ``{app}-members``, RabbitMQ
heartbeats, the one worker in embedded mode), which table versions its code declares,
which of its partitions each version has live, and the version it answers each table
from. From every current member's :class:`MemberTables` this module gives each table's
versions with their state:

- ``active``: the version views answer from. The highest version live on every
  partition of the group (a partition owned by a worker that does not declare the
  version is not live for it), or higher: a version some member already answers from
  (the switch is one-way, so a partition that moves does not switch the group back).
  With none of these, the lowest version declared (nothing was built before it).
- ``building``: declared, above the active one, not live everywhere yet.
- ``built``: declared ``switch="manual"``, live everywhere, above the active one, and not
  switched to yet (``streamapp versions switch``): views answer from it only when pinned.
- ``previous``: declared, below the active one (still readable when pinned).
- ``retired``: retired by ``streamapp retire`` (never served).

A version that is retired, or that no member declares, is never active.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

TableVersion = tuple[str, int]
"""(table name, version)."""


class State(enum.Enum):
    BUILDING = "building"
    BUILT = "built"
    ACTIVE = "active"
    PREVIOUS = "previous"
    RETIRED = "retired"


@dataclass(frozen=True, slots=True)
class Progress:
    """A building version's replay on one worker (or summed over the group)."""

    catching_up: int
    """Partitions whose lane of this version is not live yet."""
    store_position: int | None
    """The lowest event-store position those lanes have reached (0: none applied yet;
    None: unknown, from an older record)."""

    def merged(self, other: Progress) -> Progress:
        positions = [p for p in (self.store_position, other.store_position) if p is not None]
        return Progress(self.catching_up + other.catching_up, min(positions, default=None))

    def as_dict(self) -> dict[str, Any]:
        return {"catching_up": self.catching_up, "store_position": self.store_position}


@dataclass(frozen=True, slots=True)
class Declared:
    """One table version as one worker's code declares it, with its live partitions."""

    table: str
    version: int
    partitions: int
    """The table's partition count (its source topic's)."""
    live: frozenset[int] = frozenset()
    progress: Progress | None = None
    manual: bool = False
    """Declared ``switch="manual"``: active only once switched to."""


@dataclass(frozen=True, slots=True)
class MemberTables:
    """What one worker's directory record says of its table versions."""

    worker: str
    declared: tuple[Declared, ...]
    serving: Mapping[str, int] = field(default_factory=dict)
    """The version it answers each table from (its one-way latch)."""


@dataclass(frozen=True, slots=True)
class VersionState:
    """One version of a table in the group, as ``GET /tables`` shows it."""

    version: int
    state: State
    live: int
    total: int
    declared_by: tuple[str, ...]
    progress: Progress | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "state": self.state.value,
            "live": self.live,
            "total": self.total,
            "declared_by": list(self.declared_by),
            "progress": None if self.progress is None else self.progress.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class TableStates:
    """Every known version of one table, in version order, and the active one."""

    name: str
    versions: tuple[VersionState, ...]
    active: int | None
    live: Mapping[int, frozenset[int]]
    """The partitions live in the group, per declared version."""

    def state_of(self, version: int) -> VersionState | None:
        return next((v for v in self.versions if v.version == version), None)

    @property
    def existing(self) -> list[int]:
        """The versions that can be asked for (declared and not retired)."""
        return [v.version for v in self.versions if v.state is not State.RETIRED]


def group_states(
    members: Iterable[MemberTables],
    retired: Iterable[TableVersion] = (),
    latched: Mapping[str, int] | None = None,
    switched: Iterable[TableVersion] = (),
) -> dict[str, TableStates]:
    """Each table's versions and states, from every current member's record.

    ``latched``: the versions this worker answered from so far (its own latch; the
    members' latches are in their records). The result's ``active`` is never below a
    latched version that is still declared and not retired. ``switched``: the manual
    versions switched to (a manual version is never active before).
    """
    members = list(members)
    gone = set(retired)
    declared_by: dict[TableVersion, list[str]] = {}
    totals: dict[TableVersion, int] = {}
    live: dict[TableVersion, set[int]] = {}
    progress: dict[TableVersion, Progress] = {}
    manual: set[TableVersion] = set()
    for member in members:
        for d in member.declared:
            tv = (d.table, d.version)
            if d.manual:
                manual.add(tv)
            declared_by.setdefault(tv, []).append(member.worker)
            totals[tv] = max(totals.get(tv, 0), d.partitions)
            live.setdefault(tv, set()).update(d.live)
            if d.progress is not None:
                known = progress.get(tv)
                progress[tv] = d.progress if known is None else known.merged(d.progress)
    held = manual - set(switched)
    """Manual versions not switched to: never active (a latch on one is kept: one-way)."""
    latches: dict[str, int] = {}
    for source in [*(m.serving for m in members), latched or {}]:
        for table, version in source.items():
            if (table, version) in declared_by and (table, version) not in gone:
                latches[table] = max(latches.get(table, 0), version)
    names = {t for t, _ in declared_by} | {t for t, _ in gone}
    out: dict[str, TableStates] = {}
    for name in sorted(names):
        versions = sorted(
            {v for t, v in declared_by if t == name} | {v for t, v in gone if t == name}
        )
        usable = [v for v in versions if (name, v) in declared_by and (name, v) not in gone]
        complete = [v for v in usable if live[(name, v)] >= set(range(totals[(name, v)]))]
        ready = [v for v in complete if (name, v) not in held]
        candidates = [*ready, *([latches[name]] if name in latches else [])]
        active = max(candidates) if candidates else min(usable, default=None)
        states = []
        for v in versions:
            tv = (name, v)
            if tv in gone:
                state = State.RETIRED
            elif active is not None and v > active:
                state = State.BUILT if v in complete and tv in held else State.BUILDING
            else:
                state = State.ACTIVE if v == active else State.PREVIOUS
            total = totals.get(tv, 0)
            states.append(
                VersionState(
                    v,
                    state,
                    len({p for p in live.get(tv, set()) if p < total}),
                    total,
                    tuple(sorted(declared_by.get(tv, []))),
                    progress.get(tv) if state is State.BUILDING else None,
                )
            )
        out[name] = TableStates(
            name,
            tuple(states),
            active,
            {v: frozenset(live[(name, v)]) for v in usable},
        )
    return out


# records -----------------------------------------------------------------------------
def encode_member(member: MemberTables) -> dict[str, Any]:
    """The ``tables`` and ``serving`` fields of a directory record (JSON-ready)."""
    return {
        "tables": [
            {
                "table": d.table,
                "version": d.version,
                "partitions": d.partitions,
                "live": sorted(d.live),
                "progress": None if d.progress is None else d.progress.as_dict(),
                **({"manual": True} if d.manual else {}),
            }
            for d in member.declared
        ],
        "serving": dict(member.serving),
    }


def parse_member(
    worker: str, record: Mapping[str, Any], old: Iterable[Declared]
) -> MemberTables | None:
    """The table versions of a directory record; a record without ``tables`` (a worker
    of an older streamapp) declares ``old`` (version 1 of each table, live where it
    owns the partition: the caller knows). None: fields this streamapp cannot read."""
    if "tables" not in record:
        return MemberTables(worker, tuple(old))
    try:
        declared = tuple(_declared(entry) for entry in record["tables"])
        serving = {str(t): int(v) for t, v in (record.get("serving") or {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return MemberTables(worker, declared, serving)


def _declared(entry: Mapping[str, Any]) -> Declared:
    version, partitions = entry["version"], entry["partitions"]
    if not isinstance(version, int) or not isinstance(partitions, int) or version < 1:
        raise ValueError(entry)
    raw = entry.get("progress")
    progress = None
    if raw is not None:
        position = raw.get("store_position")
        progress = Progress(int(raw["catching_up"]), None if position is None else int(position))
    return Declared(
        str(entry["table"]),
        version,
        partitions,
        frozenset(int(p) for p in entry.get("live") or ()),
        progress,
        bool(entry.get("manual", False)),
    )
