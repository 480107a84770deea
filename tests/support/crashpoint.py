"""``python -m tests.support.crashpoint worker ...``: the streamapp CLI with a crash point.

The crash tests run workers through this launcher instead of ``python -m streamapp.cli``.
It wraps the collaborators of :class:`streamapp.engine.commit.Commit` (class methods; no
production code knows about it), then calls the CLI's ``main``. On the Nth commit of a
Kafka partition task that sends derived events (to ``STREAMAPP_TEST_CRASH_TOPIC`` when
set), it kills its own process with SIGKILL at the step named by
``STREAMAPP_TEST_CRASH_AT`` of the commit order (``engine/commit.py``'s docstring):

- ``before_commit``: inside the transaction, every send flushed to the broker, before
  ``commit_transaction`` (the batch is aborted: nothing of it is visible);
- ``after_commit``: the transaction committed (changelogs, derived events), before the
  store write;
- ``after_write``: every lane's store written, before the settle (the group's offset is
  behind the checkpoint);
- ``after_settle``: the source's offset committed at the broker (a coalesced commit:
  once it was answered).

The partitions' batches commit in one transaction of the worker (its
``TransactionalWriter``), which runs ``commit_transaction`` in its own task:
``before_commit`` is armed for the transaction holding the Nth batch. Two more points
kill in a transaction shared by two partitions, the Nth such transaction (each
partition's batch with derived events):

- ``shared_after_commit``: the shared transaction committed, before either
  partition's store write;
- ``shared_between_writes``: after the first of the two partitions wrote its store,
  before the second did.

At these points the writer's cycle waits up to ``SHARED_LINGER_S`` for a partition busy
with a batch, so that the two partitions share transactions however loaded the machine.

``STREAMAPP_TEST_CRASH_BATCH`` is N (default 1). Before the kill, a JSON report goes to
``STREAMAPP_TEST_CRASH_REPORT`` (when set): the point, the source partition, the batch's
end position (its checkpoint's ``live``) and the ``ce_id`` of each derived event, so that
the test can check what is durable where at that very point.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

POINTS = ("before_commit", "after_commit", "after_write", "after_settle")
SHARED_POINTS = ("shared_after_commit", "shared_between_writes")
SHARED_LINGER_S = 0.5
SHARED_MEET_S = 10.0
"""At the shared points, how long a cycle before the shared one waits for a second
partition's part (then it commits what it has)."""
"""How long a cycle waits for a busy partition's batch at the shared points (the
writer's own bound is a few milliseconds: on a loaded machine two partitions could
alternate, a transaction each, and never share one)."""
AT = "STREAMAPP_TEST_CRASH_AT"
BATCH = "STREAMAPP_TEST_CRASH_BATCH"
TOPIC = "STREAMAPP_TEST_CRASH_TOPIC"
REPORT = "STREAMAPP_TEST_CRASH_REPORT"

log = logging.getLogger("tests.crashpoint")
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


@dataclass
class _Commit:
    """One call of Commit: whether it is the one to crash, and what it holds."""

    armed: bool = False
    report: dict[str, Any] = field(default_factory=dict)
    writes_left: int = 0


@dataclass
class CrashPoint:
    """Where to crash, and the commits with sends counted so far."""

    at: str
    batch: int = 1
    topic: str | None = None
    report: str | None = None
    counted: int = 0
    armed_outputs: Any = None
    """The outputs of the batch armed (``before_commit``: its transaction is the one)."""
    shared: dict[int, Any] | None = None
    """The shared transaction armed: its batches (by id) and their partitions."""
    shared_report: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls) -> CrashPoint:
        at = os.environ.get(AT, "")
        if at not in POINTS + SHARED_POINTS:
            raise SystemExit(f"{AT}={at!r}: name one of {', '.join(POINTS + SHARED_POINTS)}")
        batch = int(os.environ.get(BATCH) or 1)
        return cls(at, batch, os.environ.get(TOPIC) or None, os.environ.get(REPORT) or None)

    def counts(self, outputs: Sequence[Any]) -> bool:
        """Whether a commit with these derived events is the Nth (each one counted)."""
        if not outputs or (self.topic and not any(m.topic == self.topic for m in outputs)):
            return False
        self.counted += 1
        return self.counted == self.batch

    def kill(self, state: _Commit | None, point: str) -> None:
        """Report, then SIGKILL this process (no flush, no close, nothing after)."""
        report = {**(state.report if state else self.shared_report), "point": point}
        if self.report:
            with open(self.report, "w") as f:
                json.dump(report, f)
                f.flush()
                os.fsync(f.fileno())
        log.warning("crash point %s: killing this worker (%s)", point, report)
        os.kill(os.getpid(), signal.SIGKILL)


_current: contextvars.ContextVar[_Commit | None] = contextvars.ContextVar(
    "crashpoint_commit", default=None
)


def _armed(point: str, crash: CrashPoint) -> _Commit | None:
    state = _current.get()
    return state if state is not None and state.armed and crash.at == point else None


def install(crash: CrashPoint) -> None:
    """Wrap the commit's collaborators (class attributes) to crash as ``crash`` says."""
    from aiokafka import AIOKafkaProducer

    from streamapp.engine.commit import Commit
    from streamapp.tables.partition import PartitionTables
    from streamapp.transports.kafka.port import KafkaPartitionPort
    from streamapp.transports.kafka.transaction import KafkaTransaction
    from streamapp.transports.kafka.txn_writer import TransactionalWriter

    def around(cls: Any, name: str) -> Callable[[F], F]:
        """Replace method ``name`` of ``cls`` by ``wrapper(original, self, ...)``."""
        original = getattr(cls, name)

        def decorate(wrapper: F) -> F:
            @functools.wraps(original)
            async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
                return await wrapper(original, self, *args, **kwargs)

            setattr(cls, name, method)
            return wrapper

        return decorate

    @around(Commit, "__call__")
    async def commit_call(original: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _current.set(_Commit())
        try:
            return await original(self, *args, **kwargs)
        finally:
            _current.reset(token)

    @around(KafkaTransaction, "commit")
    async def transaction_commit(
        original: Any, self: Any, changes: Any, outputs: Any, settle: Any
    ) -> Any:
        state = _current.get()
        lives = [batch.checkpoint.live for _, batch in changes]
        _batches[id(outputs)] = (self.source, changes, lives)
        if crash.at in POINTS and state is not None and crash.counts(outputs):
            state.armed, state.writes_left = True, len(changes)
            crash.armed_outputs = outputs
            _armed_reports.append(state)
            state.report = {
                "topic": self.source.topic,
                "partition": self.source.partition,
                "live": max((p for p in lives if p is not None), default=None),
                "settle": None if settle is None else settle.position,
                "outputs": _ids(outputs),
            }
        try:
            positions = await original(self, changes, outputs, settle)
        finally:
            _batches.pop(id(outputs), None)
        if state is not None and (armed := _armed("after_commit", crash)) is not None:
            crash.kill(armed, "after_commit")
        return positions

    if crash.at in SHARED_POINTS:  # both partitions' batches meet in one transaction
        original_init = TransactionalWriter.__init__

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **{**kwargs, "linger_s": SHARED_LINGER_S})

        TransactionalWriter.__init__ = functools.wraps(original_init)(init)  # type: ignore[method-assign]

        @around(TransactionalWriter, "_gather")
        async def gather(original: Any, self: Any) -> Any:
            """Until the shared transaction is reached, a cycle also waits (bounded) for
            a part of a second partition: whether two partitions' batches meet in one
            cycle is otherwise a matter of timing (both have thousands of events to go,
            so the second one's part comes)."""
            await original(self)
            if crash.counted >= crash.batch:
                return
            for _ in range(int(SHARED_MEET_S / 0.005)):
                if len({part.source for part in self._queue if part.outputs}) >= 2:
                    return
                await asyncio.sleep(0.005)

    @around(TransactionalWriter, "run")
    async def run(original: Any, self: Any, parts: Any) -> Any:
        """Arms ``before_commit`` for the transaction holding the armed batch, and the
        shared points for the Nth transaction of two partitions' batches with sends."""
        holds = any(part.outputs is crash.armed_outputs for part in parts)
        token = _in_txn.set(holds)
        shared = crash.at in SHARED_POINTS and _two_partitions(parts)
        if shared:
            crash.counted += 1
            shared = crash.counted == crash.batch
        try:
            result = await original(self, parts)
        finally:
            _in_txn.reset(token)
        if shared:
            batches: dict[int, Any] = {}
            report: dict[str, Any] = {}
            for part in parts:
                source, changes, lives = _batches[id(part.outputs)]
                for _, batch in changes:
                    batches[id(batch)] = source.partition
                report[str(source.partition)] = {
                    "live": max((p for p in lives if p is not None), default=None),
                    "outputs": _ids(part.outputs),
                }
            crash.shared_report = {"topic": parts[0].source.topic, "partitions": report}
            if crash.at == "shared_after_commit":
                crash.kill(None, "shared_after_commit")
            crash.shared = batches
        return result

    @around(AIOKafkaProducer, "commit_transaction")
    async def commit_transaction(original: Any, self: Any) -> Any:
        armed = _armed("before_commit", crash)
        if armed is None and crash.at == "before_commit" and _in_txn.get():
            armed = _report_of()  # the writer's task runs the armed batch's transaction
        if armed is not None:
            await self.flush()  # every send of the batch reached the broker
            crash.kill(armed, "before_commit")
        return await original(self)

    original_write = PartitionTables.write

    def write(self: Any, *args: Any, **kwargs: Any) -> None:
        original_write(self, *args, **kwargs)
        shared = crash.shared
        batch = args[0] if args else kwargs.get("batch")
        if shared is not None and id(batch) in shared:
            partition = shared.pop(id(batch))
            if partition not in shared.values():  # every lane of that partition wrote
                crash.shared_report["written"] = partition
                crash.kill(None, "shared_between_writes")
        armed = _armed("after_write", crash)
        if armed is not None:
            armed.writes_left -= 1
            if armed.writes_left <= 0:  # every lane of the commit wrote its batch
                crash.kill(armed, "after_write")

    PartitionTables.write = functools.wraps(original_write)(write)  # type: ignore[method-assign]

    @around(KafkaPartitionPort, "settle")
    async def settle(original: Any, self: Any, *args: Any, **kwargs: Any) -> None:
        await original(self, *args, **kwargs)
        armed = _armed("after_settle", crash)
        if armed is not None:
            if self.commits is not None:  # coalesced: until the broker answered it
                await self.commits.settled(self.tp)
            crash.kill(armed, "after_settle")


_in_txn: contextvars.ContextVar[bool] = contextvars.ContextVar("crashpoint_txn", default=False)
"""Set while the writer runs the transaction holding the armed batch."""
_batches: dict[int, Any] = {}
"""Batches handed to the writer, by ``id(outputs)``: source, changes, checkpoints' live."""
_armed_reports: list[_Commit] = []


def _ids(outputs: Sequence[Any]) -> list[str]:
    return [dict(m.headers).get("ce_id", b"").decode() for m in outputs]


def _two_partitions(parts: Sequence[Any]) -> bool:
    """Batches of two partitions or more, each with derived events."""
    with_sends = {part.source for part in parts if part.outputs}
    return len(with_sends) >= 2


def _report_of() -> _Commit | None:
    """The armed batch's commit state (its report)."""
    for state in _armed_reports:
        if state.armed:
            return state
    return None


def main() -> None:
    crash = CrashPoint.from_env()
    install(crash)
    from streamapp.cli import main as cli

    cli(prog_name="streamapp")


if __name__ == "__main__":
    main()
