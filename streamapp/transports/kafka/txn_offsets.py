"""Offsets in a transaction with the group's metadata: ``TxnOffsetCommit`` v3 (KIP-447).

Exactly-once v2 commits a worker's offsets in its transaction with the consumer group's
generation and member id, so that the group coordinator refuses the offsets, and the
worker aborts the transaction, once the group has moved on without it: a zombie (a
worker whose partitions moved) is fenced by the group, not by a transactional id per
partition (:mod:`streamapp.transports.kafka.txn_writer`).

aiokafka 0.14 defines ``TxnOffsetCommitRequest`` v0 only (``protocol/transaction.py``),
and ``send_offsets_to_transaction(offsets, group_id)`` takes no group metadata: its
sender's ``TxnOffsetCommitHandler`` builds that v0 request. This module defines v3 (the
first version with ``generation_id``, ``member_id`` and ``group_instance_id``; flexible)
on aiokafka's protocol classes, and a handler that sends it (the version negotiated with
the broker: v3 when it serves it, else v0) with the metadata its transactional id was
given (:func:`set_member`), and that makes the group's refusals (``ILLEGAL_GENERATION``,
``UNKNOWN_MEMBER_ID``, ``FENCED_INSTANCE_ID``, ``REBALANCE_IN_PROGRESS``) an abortable
error of the transaction (aiokafka's own handler would stop its sender on them).
:func:`install` puts the handler in aiokafka's sender module (process-wide; a producer
whose transactional id has no metadata sends generation -1 and no member id, which the
broker does not check: aiokafka's v0 behaviour).

Transactions v2 (KIP-890) are not used, though Kafka 4 brokers offer them: a client
takes part in them only with ``EndTxn`` v5 and ``Produce`` v12 (partitions added to the
transaction implicitly, a new producer epoch returned by every ``EndTxn``, which the
client must use from then on) and ``TxnOffsetCommit`` v5. aiokafka 0.14 defines
``EndTxn`` v0, ``AddPartitionsToTxn`` v0, ``InitProducerId`` v0 and ``Produce`` up to v8,
and its transaction manager keeps one epoch for the producer's life: v2 would need
aiokafka's transaction manager and sender rewritten, not one request added. The Kafka
4.1.2 broker the tests run on serves ``EndTxn`` up to v5, ``Produce`` up to v13 and
``TxnOffsetCommit`` up to v5 (measured on 2026-12-06), so v2 is there for a client that
can speak it; it serves aiokafka with transactions v1 (``AddPartitionsToTxn`` before the
first send to a partition, ``AddOffsetsToTxn`` before the offsets: two round trips per
transaction that v2 would save).
"""

from __future__ import annotations

import collections
import logging
from typing import Any, NamedTuple, TypeAlias

import aiokafka.errors as errors
from aiokafka.producer import sender
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.transaction import TxnOffsetCommitRequest_v0
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

log = logging.getLogger("streamapp.kafka")


class Member(NamedTuple):
    """The consumer group's metadata an offset commit is checked against."""

    generation_id: int
    member_id: str
    group_instance_id: str | None = None


NO_MEMBER = Member(-1, "")
"""No group metadata: the broker does not check the offsets against the group."""

_members: dict[str, Member] = {}


def set_member(transactional_id: str, member: Member | None) -> None:
    """The group metadata of the next ``TxnOffsetCommit`` of ``transactional_id``'s
    producer (None: forget it)."""
    if member is None:
        _members.pop(transactional_id, None)
    else:
        _members[transactional_id] = member


GROUP_FENCED = {
    22: "ILLEGAL_GENERATION",
    25: "UNKNOWN_MEMBER_ID",
    27: "REBALANCE_IN_PROGRESS",
    82: "FENCED_INSTANCE_ID",
}
"""Error codes by which the group coordinator refuses a member's offsets."""


class _GroupRefused(errors.KafkaError):  # type: ignore[misc]
    """The group coordinator refused the transaction's offsets: the member's generation
    is not the group's (or a rebalance is completing). Abortable: the transaction is
    aborted, its partitions rewind."""

    retriable = False

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class TxnOffsetCommitResponse_v3(Response):  # type: ignore[misc]
    API_KEY = 28
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "errors",
            CompactArray(
                ("topic", CompactString("utf-8")),
                (
                    "partition_errors",
                    CompactArray(
                        ("partition", Int32), ("error_code", Int16), ("tags", TaggedFields)
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest_v3(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 28
    API_VERSION = 3
    RESPONSE_TYPE = TxnOffsetCommitResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("topic", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition", Int32),
                        ("offset", Int64),
                        ("leader_epoch", Int32),
                        ("metadata", CompactString("utf-8")),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


Struct: TypeAlias = TxnOffsetCommitRequest_v0 | TxnOffsetCommitRequest_v3


class GroupTxnOffsetCommitRequest(Request[Struct]):  # type: ignore[misc]
    """``TxnOffsetCommit`` with the group's metadata (v3), or v0 where the broker has no v3."""

    API_KEY = 28

    def __init__(
        self,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        member: Member,
        topics: list[tuple[str, list[tuple[int, int, str]]]],
    ) -> None:
        self.transactional_id, self.group_id = transactional_id, group_id
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.member, self.topics = member, topics

    def build(self, request_struct_class: type[Struct]) -> Struct:
        if request_struct_class is TxnOffsetCommitRequest_v0:
            if self.member != NO_MEMBER:
                log.warning(
                    "the broker serves no TxnOffsetCommit v3: offsets of %s are committed "
                    "without the group's generation (no zombie fencing by the group)",
                    self.transactional_id,
                )
            return TxnOffsetCommitRequest_v0(
                self.transactional_id,
                self.group_id,
                self.producer_id,
                self.producer_epoch,
                self.topics,
            )
        topics: list[
            tuple[str, list[tuple[int, int, int, str, dict[int, bytes]]], dict[int, bytes]]
        ]
        topics = [
            (topic, [(p, offset, -1, metadata, {}) for p, offset, metadata in parts], {})
            for topic, parts in self.topics
        ]
        return TxnOffsetCommitRequest_v3(
            self.transactional_id,
            self.group_id,
            self.producer_id,
            self.producer_epoch,
            self.member.generation_id,
            self.member.member_id,
            self.member.group_instance_id,
            topics,
            {},
        )


class GroupTxnOffsetCommitHandler(sender.TxnOffsetCommitHandler):  # type: ignore[misc]
    """aiokafka's handler, sending :class:`GroupTxnOffsetCommitRequest` and making the
    group's refusals (:data:`GROUP_FENCED`) an abortable error of the transaction."""

    def create_request(self) -> GroupTxnOffsetCommitRequest:
        manager = getattr(self._sender, "_txn_manager", None)
        assert manager is not None
        offsets: dict[str, list[tuple[int, int, str]]] = collections.defaultdict(list)
        for tp, offset in sorted(self._offsets.items()):
            offsets[tp.topic].append((tp.partition, offset.offset, offset.metadata))
        return GroupTxnOffsetCommitRequest(
            manager.transactional_id,
            self._group_id,
            manager.producer_id,
            manager.producer_epoch,
            _members.get(manager.transactional_id, NO_MEMBER),
            list(offsets.items()),
        )

    def handle_response(self, resp: Any) -> float | None:
        manager = getattr(self._sender, "_txn_manager", None)
        assert manager is not None
        flat = [(entry[0], [(p[0], p[1]) for p in entry[1]]) for entry in resp.errors]
        for topic, partitions in flat:
            for partition, code in partitions:
                if code in GROUP_FENCED:
                    member = _members.get(manager.transactional_id, NO_MEMBER)
                    manager.error_transaction(
                        _GroupRefused(
                            f"{GROUP_FENCED[code]}: the group coordinator of {self._group_id} "
                            f"refused the offsets of {topic}[{partition}] committed as member "
                            f"{member.member_id!r} of generation {member.generation_id}",
                            code,
                        )
                    )
                    return None
        if resp.API_VERSION == 0:
            return super().handle_response(resp)  # type: ignore[no-any-return]
        return super().handle_response(_V0Errors(flat))  # type: ignore[no-any-return]


class _V0Errors(NamedTuple):
    """A v3 response's errors in v0's shape, for aiokafka's handling of the others."""

    errors: list[tuple[str, list[tuple[int, int]]]]


def group_refusal(exc: BaseException) -> str | None:
    """The group coordinator's error name when ``exc`` is its refusal of a transaction's
    offsets (one of :data:`GROUP_FENCED`), else None."""
    return GROUP_FENCED.get(exc.code) if isinstance(exc, _GroupRefused) else None


def install() -> None:
    """Make aiokafka's transactional producers send offsets with the group's metadata
    (process-wide; idempotent)."""
    if not hasattr(sender, "TxnOffsetCommitHandler"):  # another aiokafka: v0 stays
        log.warning("aiokafka has no TxnOffsetCommitHandler: offsets go without the group")
        return
    sender.TxnOffsetCommitHandler = GroupTxnOffsetCommitHandler


__all__ = [
    "GROUP_FENCED",
    "NO_MEMBER",
    "Member",
    "group_refusal",
    "install",
    "set_member",
]
