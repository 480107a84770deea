"""The Kafka group's assignor: sticky, standby-aware, co-partitioned (``streamapp-sticky``).

Kafka's range and round-robin assignors ignore where state already is: after any
membership change they hand partitions out afresh, so partitions that did not need to
move restore their stores from the changelog elsewhere. This assignor reads what each
member holds (sent in its JoinGroup metadata, :class:`Holdings`) and decides by these
rules, in this order (:func:`plan`, pure and unit-tested):

1. **Units.** A unit is what must be owned by one member. Without co-partitioning
   (no agent ``reads=`` another's table) it is one topic partition. With it, it is
   partition ``p`` of every source topic with the same partition count (what the range
   assignor gave), so that a join reads the local store of the same partition.
2. **Quota.** No member owns more than ``ceil(units / members)`` units.
3. **Sticky.** A unit stays with the member that owned it in the newest generation any
   member reports (a frozen worker woken later reports an older generation and loses
   the claim), while that member is under its quota. With the same members, nothing
   moves.
4. **Lost units go to warm copies.** A unit whose owner is gone (its worker died or
   left) goes to a member whose standby of it is caught up (at most
   :data:`ACCEPTABLE_LAG` records behind), the least loaded of them, even past its quota:
   availability before balance (a standby is promoted and restores only the tail it had
   not applied). Any other unit without an owner (its owner was over quota, or no
   standby of it is caught up) goes to the member under quota whose standby of it is
   the fewest records behind, else to the least-loaded one (it restores in full). A
   member over quota after a failure gives units back at the next rebalance (rule 3).
5. **Standbys.** With ``standby_replicas`` = N, each unit gets N standby members, never
   its owner, preferring the members that hold a standby of it or owned it (they have
   its state on disk), then the members with the fewest standbys of that owner's units
   (a dead owner's units are warm on several survivors, each with room under its
   quota), then the members with the fewest standbys. A group of fewer
   than N + 1 members gets fewer standbys. The standby units travel to each member in
   its assignment's user data.

6. **Warm-ups** (with ``standby_replicas`` above 0; KIP-441): a unit moves to a member
   without a caught-up copy of it only through a warm-up. A unit its owner must give
   back for balance (past its quota: a member joined, or a failure left it more) stays
   with it, and a member under quota builds a standby of it first (one of its
   standbys, marked as a warm-up in the assignment). When every warm-up standby of a
   member has caught up, that member asks the group to rebalance (a probing rebalance,
   :func:`streamapp.transports.kafka.warmup.request_rejoin`); then rule 4 gives it the
   unit, which restores only the tail. So a scale-out leaves no partition unavailable
   while it restores. Without standbys a unit moves at once and restores in full.

aiokafka calls an assignor's ``metadata`` at each join and ``on_assignment`` before the
rebalance listener's ``on_partitions_assigned``: :class:`StickyAssignor` asks the
source what it holds for the first and keeps the standbys of the second for the
source to take (:meth:`StickyAssignor.take`). It is the only assignor the source
offers: aiokafka 0.14 sends one JoinGroup per assignor offered, each with the protocols
listed so far, and a group whose members join with two protocol lists keeps
rebalancing. So every worker of a group must run this assignor: a group of workers of
an older streamapp (range or round robin) is stopped before the new ones start.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import orjson
from aiokafka import TopicPartition
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

log = logging.getLogger("streamapp.kafka")

NAME = "streamapp-sticky"
"""The assignor's protocol name in the group (every member must offer it to use it)."""
VERSION = 1

Unit = tuple[TopicPartition, ...]
"""Topic partitions that one member owns together (sorted)."""


@dataclass(frozen=True, slots=True)
class Holdings:
    """What one member holds, as it sends it when joining the group."""

    generation: int = -1
    """The generation of the assignment ``active`` is from (-1: none yet)."""
    active: frozenset[TopicPartition] = frozenset()
    """The partitions it owned in that assignment."""
    standby: Mapping[TopicPartition, int] = field(default_factory=dict)
    """Its standby partitions, each with the changelog records it is behind (-1: not
    known yet)."""

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "v": VERSION,
                "generation": self.generation,
                "active": sorted([tp.topic, tp.partition] for tp in self.active),
                "standby": sorted(
                    [tp.topic, tp.partition, lag] for tp, lag in self.standby.items()
                ),
            }
        )

    @classmethod
    def decode(cls, raw: bytes | None) -> Holdings:
        """The member's holdings; nothing when ``raw`` is empty or not ours (logged)."""
        if not raw:
            return cls()
        try:
            body = orjson.loads(raw)
            return cls(
                int(body.get("generation", -1)),
                frozenset(TopicPartition(str(t), int(p)) for t, p in body.get("active", [])),
                {TopicPartition(str(t), int(p)): int(lag) for t, p, lag in body.get("standby", [])},
            )
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("a member's assignor metadata is not readable (%r): taken as empty", exc)
            return cls()


@dataclass(frozen=True, slots=True)
class Candidate:
    """A member as :func:`plan` sees it (a candidate for each unit): what it subscribes to
    and what it holds."""

    topics: frozenset[str]
    held: Holdings = field(default_factory=Holdings)


@dataclass(slots=True)
class Planned:
    """One member's share: the partitions it owns and those it keeps standbys of."""

    active: list[TopicPartition] = field(default_factory=list)
    standby: list[TopicPartition] = field(default_factory=list)
    warmup: list[TopicPartition] = field(default_factory=list)
    """Standbys built to take the partition over once caught up (rule 6)."""


def units_of(partitions: Mapping[str, int], copartitioned: bool) -> list[Unit]:
    """The units of topics with these partition counts (rule 1)."""
    if not copartitioned:
        return [(TopicPartition(t, p),) for t, n in sorted(partitions.items()) for p in range(n)]
    by_count: dict[int, list[str]] = {}
    for topic, n in sorted(partitions.items()):
        by_count.setdefault(n, []).append(topic)
    return [
        tuple(TopicPartition(t, p) for t in topics)
        for n, topics in sorted(by_count.items())
        for p in range(n)
    ]


def plan(
    units: list[Unit], members: Mapping[str, Candidate], replicas: int, *, warmups: bool = False
) -> dict[str, Planned]:
    """Each member's share of ``units`` by the module's rules; ``replicas``: setting
    ``standby_replicas``; ``warmups``: move a unit to a member without its state only
    through a warm-up (rule 6)."""
    out = {m: Planned() for m in members}
    if not members:
        return out
    eligible = {u: sorted(m for m, v in members.items() if _subscribes(v, u)) for u in units}
    quota = math.ceil(len(units) / len(members))
    load = dict.fromkeys(members, 0)
    owner: dict[Unit, str] = {}
    lost: list[tuple[Unit, str | None]] = []
    for unit in units:  # rule 3: the newest claim, while under quota
        claim = _claimant(unit, eligible[unit], members)
        if claim is not None and load[claim] < quota:
            owner[unit] = claim
            load[claim] += 1
        else:
            lost.append((unit, claim))
    for unit, claim in lost:  # rule 4
        behind = {m: _behind(unit, members[m]) for m in eligible[unit]}
        under = [m for m in eligible[unit] if load[m] < quota]
        if claim is None and any(b <= ACCEPTABLE_LAG for b in behind.values()):
            # its owner is gone: availability before balance
            warm = [m for m, b in behind.items() if b <= ACCEPTABLE_LAG]
            best = min(warm, key=lambda m: (load[m], behind[m], m))
        elif warmups and claim is not None and all(behind[m] > ACCEPTABLE_LAG for m in under):
            best = claim  # rule 6: it stays until a member under quota has it warm
        elif under or eligible[unit]:
            best = min(under or eligible[unit], key=lambda m: (behind[m], load[m], m))
        else:
            continue  # nobody subscribes to it: no owner, as Kafka's own assignors do
        owner[unit] = best
        load[best] += 1
    warming = _warmups(units, owner, eligible, load, quota) if warmups else {}
    standbys = dict.fromkeys(members, 0)
    pairs: dict[tuple[str, str], int] = {}
    """Standbys per (owner, member): one owner's units spread over the others, so that
    its death leaves each survivor room for the ones it has warm (rule 2)."""
    for unit in units:  # rule 5
        if unit not in owner:
            continue
        home = owner[unit]
        out[home].active.extend(unit)
        chosen: list[str] = []
        if unit in warming:
            chosen.append(warming[unit])
            out[warming[unit]].warmup.extend(unit)
        while len(chosen) < replicas:
            left = [m for m in eligible[unit] if m != home and m not in chosen]
            if not left:
                break
            best = min(
                left,
                key=lambda m: (
                    not _has_state(unit, members[m]),
                    pairs.get((home, m), 0),
                    standbys[m],
                    m,
                ),
            )
            chosen.append(best)
        for m in chosen:
            standbys[m] += 1
            pairs[(home, m)] = pairs.get((home, m), 0) + 1
            out[m].standby.extend(unit)
    return out


def _warmups(
    units: list[Unit],
    owner: Mapping[Unit, str],
    eligible: Mapping[Unit, list[str]],
    load: Mapping[str, int],
    quota: int,
) -> dict[Unit, str]:
    """Rule 6: each unit past its owner's quota (the last ones, in unit order, as rule 3
    gives them back) gets a member under quota that builds a standby of it first."""
    pending = dict(load)
    out: dict[Unit, str] = {}
    for home in sorted(set(owner.values())):
        mine = [u for u in units if owner.get(u) == home]
        for unit in mine[quota:]:
            room = [m for m in eligible[unit] if m != home and pending[m] < quota]
            if room:
                target = min(room, key=lambda m: (pending[m], m))
                out[unit] = target
                pending[target] += 1
    return out


def _subscribes(member: Candidate, unit: Unit) -> bool:
    return all(tp.topic in member.topics for tp in unit)


def _claimant(unit: Unit, eligible: list[str], members: Mapping[str, Candidate]) -> str | None:
    """The member that owned ``unit`` in the newest generation reported (ties: the
    one that owned more of it, then the lowest member id)."""
    best: tuple[int, int, str] | None = None
    for m in eligible:
        held = members[m].held
        owned = sum(tp in held.active for tp in unit)
        if owned:
            key = (-held.generation, -owned, m)
            best = key if best is None or key < best else best
    return None if best is None else best[2]


ACCEPTABLE_LAG = 10_000
"""A standby at most this many records behind is caught up (Kafka Streams'
``acceptable.recovery.lag``): a unit whose owner is gone goes to it even past the quota."""
NO_STATE = 1 << 62
"""How far behind a member without a standby of a unit counts (after every standby)."""


def _behind(unit: Unit, member: Candidate) -> int:
    """The records ``member``'s standbys of ``unit`` are behind (the worst of them), or
    :data:`NO_STATE`; a standby whose lag is not known yet counts just before none."""
    lags = [member.held.standby.get(tp) for tp in unit]
    if any(lag is None for lag in lags):
        return NO_STATE
    known = [lag for lag in lags if lag is not None]
    return NO_STATE - 1 if any(lag < 0 for lag in known) else max(known, default=0)


def _has_state(unit: Unit, member: Candidate) -> bool:
    held = member.held
    return all(tp in held.standby or tp in held.active for tp in unit)


class StickyAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """The assignor (an instance: aiokafka calls its methods, classmethods or not)."""

    name = NAME
    version = VERSION

    def __init__(
        self, held: Callable[[], Holdings], replicas: int, copartitioned: bool, *, warmups: bool
    ) -> None:
        self._held, self.replicas, self.copartitioned = held, replicas, copartitioned
        self.warmups = warmups
        self._given: Given | None = None

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(self.version, list(topics), self._held().encode())

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        seen = {
            m: Candidate(frozenset(meta.subscription), Holdings.decode(meta.user_data))
            for m, meta in members.items()
        }
        counts: dict[str, int] = {}
        for topic in sorted({t for v in seen.values() for t in v.topics}):
            partitions = cluster.partitions_for_topic(topic)
            if partitions is None:
                log.warning("no partition metadata for topic %s: not assigned", topic)
                continue
            counts[topic] = len(partitions)
        units = units_of(counts, self.copartitioned)
        planned = plan(units, seen, self.replicas, warmups=self.warmups)
        return {
            m: ConsumerProtocolMemberAssignment(
                self.version,
                _by_topic(share.active),
                Given(frozenset(share.standby), frozenset(share.warmup)).encode(),
            )
            for m, share in planned.items()
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        self._given = Given.decode(assignment.user_data)

    def take(self) -> Given:
        """The standbys and warm-ups of the assignment this assignor received last, once
        (none when the group used another assignor)."""
        given, self._given = self._given, None
        return given or Given()


@dataclass(frozen=True, slots=True)
class Given:
    """What an assignment's user data gives a member beside its partitions."""

    standby: frozenset[TopicPartition] = frozenset()
    warmup: frozenset[TopicPartition] = frozenset()
    """The standbys among ``standby`` that are warm-ups: once caught up, the member asks
    the group to rebalance (a probing rebalance, rule 6)."""

    def encode(self) -> bytes:
        body = {"v": VERSION, "standby": _by_topic(self.standby), "warmup": _by_topic(self.warmup)}
        return orjson.dumps(body)

    @classmethod
    def decode(cls, raw: bytes | None) -> Given:
        """The user data ``raw`` (nothing when empty or unreadable, logged)."""
        if not raw:
            return cls()
        try:
            body = orjson.loads(raw)
            return cls(_tps(body.get("standby", [])), _tps(body.get("warmup", [])))
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("the assignment's standby list is not readable (%r): no standbys", exc)
            return cls()


def _tps(by_topic: Iterable[tuple[str, Iterable[int]]]) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(str(t), int(p)) for t, ps in by_topic for p in ps)


def _by_topic(tps: Iterable[TopicPartition]) -> list[tuple[str, list[int]]]:
    out: dict[str, list[int]] = {}
    for tp in tps:
        out.setdefault(tp.topic, []).append(tp.partition)
    return sorted((t, sorted(ps)) for t, ps in out.items())
