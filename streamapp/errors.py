"""Errors that name what is wrong and say what to do.

Each class says whether retrying can help (``retriable``), so a retry strategy can ask
the error instead of parsing its message.
"""

from __future__ import annotations


class StreamappError(Exception):
    """Base of every error raised by streamapp."""

    retriable: bool = False


class ConfigError(StreamappError):
    """A setting is missing or invalid; the message names the setting."""


APP_REF = "MODULE:app"
"""How a message names the app (``-A``) where the code that raises does not know it."""


class StateMismatchError(ConfigError):
    """A partition's state (local, or restored from its changelog) was made from another
    source than the one this worker runs on: another event store, a store that lost the
    positions it replayed, another partition count, fewer tables. It is never served; the
    worker stops and the message names what differs and the fix. :meth:`for_app` puts
    the worker's ``-A`` into the fix."""

    def __init__(self, message: str) -> None:
        self.template = message
        super().__init__(message)

    def for_app(self, app_ref: str) -> StateMismatchError:
        """This error with ``app_ref`` in place of :data:`APP_REF` in its message."""
        self.args = (self.template.replace(APP_REF, app_ref),)
        return self


class MissingTopicError(StreamappError):
    """A topic the app needs does not exist on the broker. Retriable: a worker started
    with (or before) ``streamapp topics create`` waits for it (setting ``startup_retry``).
    A transport whose topics are other things (RabbitMQ's exchanges and queues) gives its
    own ``message``."""

    retriable = True

    def __init__(
        self, topics: list[str], app_ref: str = "MODULE:app", *, message: str = ""
    ) -> None:
        self.topics = topics
        names = ", ".join(sorted(topics))
        super().__init__(
            message
            or f"topic(s) {names} do not exist on the broker; streamapp never auto-creates "
            f"them. Create them with `streamapp topics create -A {app_ref}`."
        )


class DecodeError(StreamappError):
    """A record is not a valid CloudEvent; ``reason`` is what a parking header carries."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class DataError(DecodeError):
    """An event's data does not fit the model its agent declares for its type (or its
    type has none and the agent rejects such types): NOT_DELIVERABLE, under the agent's
    failure policy. Raised where the handler first reads ``event.data``."""


class StoreError(StreamappError):
    """A table partition's local store failed (what RocksDB reported, by its status).

    A storage error is never a handler's failure: it does not go through the agent's
    failure policy. ``path`` is the store's directory, ``status`` RocksDB's status line.
    """

    def __init__(self, message: str, *, path: str = "", status: str = "") -> None:
        super().__init__(message)
        self.path, self.status = path, status


class StoreLockedError(StoreError):
    """Another process still holds a table partition's RocksDB directory."""

    retriable = True


class StoreCorruptError(StoreError):
    """A table partition's local store is damaged (RocksDB's ``Corruption`` status: a
    block checksum mismatch, a truncated file, a bad footer). Reading it again fails
    again: the partition's local state is wiped and rebuilt from its changelog or the
    event store."""


class StoreIOError(StoreError):
    """The disk under a table partition's store failed (RocksDB's ``IO error`` status,
    e.g. no space left on device): the batch in hand is dropped and tried again."""

    retriable = True


class PublishError(StreamappError):
    """A sink could not confirm a publish; the outcome is unknown, publish again."""

    retriable = True


class BrokerUnavailableError(StreamappError):
    """The broker did not answer within the start-up retry budget."""

    retriable = True


class StoreFormatError(StoreError):
    """A table store was written in a layout this streamapp does not read."""


class StoreClosedError(StreamappError):
    """A table partition was closed (revoked) while something still read it."""


class EventStoreUnavailableError(StreamappError):
    """The event store's database did not answer within the reconnect bound; try again."""

    retriable = True


class LockLostError(StreamappError):
    """A lock held on a database session was lost with that session (a server restart):
    whoever held it stops acting on it and takes it again."""

    retriable = True


class ForeignKeyError(StreamappError):
    """A handler wrote a key that belongs to another partition of the table."""


class OutputError(StreamappError):
    """A handler sent a derived event that cannot go out as given: to a topic its agent
    does not declare in ``sinks=[...]``, or without a stream id (the message key)."""


class GroupByError(StreamappError):
    """A re-keyed agent's key function (``group_by=``) raised or returned no usable key
    (a non-empty ``str``) for an event: the agent's failure policy applies."""


class TableUnavailableError(StreamappError):
    """A handler read another agent's table partition that this worker does not serve
    right now (restoring, moving, or owned elsewhere): the event waits and is tried again."""

    retriable = True


class Refuse(StreamappError):
    """Raised by a handler to stop its agent for good (outcome REFUSED): the event is
    not settled (no commit, no ack for it), the worker stops with this error and leaves
    the group at once, so another worker (or the next deployment) takes the partition
    over from that event. For what no retry can fix here: an event of a schema this
    code does not know, a projection that must not run past a corrupt input."""


class FencedError(StreamappError):
    """Another worker took the partition over; this one no longer owns it."""


class SourceError(StreamappError):
    """A transport's client failed; ``retriable`` says whether trying again can help."""

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


class ConcurrencyError(StreamappError):
    """An append's expected stream version is not the stream's actual one; nothing appended."""

    def __init__(
        self, stream_id: str, expected: int, actual: int, detail: str = "", fix: str = ""
    ) -> None:
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
        why = f" ({detail})" if detail else ""
        fix = fix or f"append with expected version {actual}"
        super().__init__(
            f"stream {stream_id!r}: expected version {expected}, actual version {actual}"
            f"{why}; nothing appended. Read the stream again, then {fix}."
        )


class InvalidEventError(StreamappError):
    """An event cannot be appended as given (e.g. its streamid names another stream)."""


class DuplicateEventError(InvalidEventError):
    """An append with ``on_duplicate="fail"`` holds an event whose (``source``, ``id``) is
    already in the store (or earlier in the same batch); nothing of that append stored."""

    def __init__(self, source: str, event_id: str, stream_id: str, position: int | None) -> None:
        self.source, self.event_id, self.position = source, event_id, position
        where = f"at position {position}" if position is not None else "earlier in this batch"
        super().__init__(
            f"event {event_id!r} of source {source!r} (stream {stream_id!r}) is already in "
            f"the store {where}; nothing of its append stored. Give it a new id if it is a "
            "new event, or append with on_duplicate='skip' (--on-duplicate=skip) to skip "
            "events already stored."
        )


class ShutdownTimeoutError(StreamappError):
    """A worker did not finish draining within ``shutdown_timeout_s``."""


class AgentRefusedError(StreamappError):
    """An agent raised :class:`~streamapp.Refuse`: the worker stops (see
    :data:`streamapp.engine.task.Fatal`)."""


class StoreBehindError(StreamappError):
    """A store write failed after its transaction committed: running the batch again
    would send its derived events twice, so the partition stops until it is reopened
    (its stores are then restored from the changelogs)."""


class ResetRefusedError(StreamappError):
    """``streamapp reset`` refused: a worker of the app runs (named in the message), so
    nothing was removed."""


class RetireRefusedError(StreamappError):
    """``streamapp retire`` refused (the message says why: the active version, one a
    running worker or the app's code still declares, an unknown one, no worker to ask),
    so nothing was retired or deleted."""


class UnknownAgentError(StreamappError):
    """``--agent`` names no agent of the app (the message names the closest)."""


class ReservedNameError(StreamappError, ValueError):
    """An application sent a header or extension whose name streamapp or a CloudEvents
    binding owns; the message names it and a free name."""


class PhaseTransitionError(StreamappError, RuntimeError):
    """A partition task was asked to move between phases its transitions table does not
    link (:data:`streamapp.engine.phase.TRANSITIONS`): a bug in streamapp, not in the app."""


class ReplayError(StreamappError):
    """A parked or dead-lettered record could not be sent back to its origin topic, or a
    replay's options do not apply; ``sent`` counts the records confirmed before it."""

    def __init__(self, message: str, *, sent: int = 0) -> None:
        super().__init__(message)
        self.sent = sent
