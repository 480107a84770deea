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


class MissingTopicError(StreamappError):
    """A topic the app needs does not exist on the broker."""

    def __init__(
        self, topics: list[str], app_ref: str = "MODULE:app", *, broker: str = "kafka"
    ) -> None:
        self.topics = topics
        names = ", ".join(sorted(topics))
        if broker == "rabbitmq":  # names are "exchange X" / "queue X.p"
            super().__init__(
                f"{names} missing on RabbitMQ; streamapp never auto-creates them. Create "
                f"them with `STREAMAPP_BROKER=rabbitmq streamapp topics create -A {app_ref}`."
            )
            return
        super().__init__(
            f"topic(s) {names} do not exist on the broker; streamapp never auto-creates "
            f"them. Create them with `streamapp topics create -A {app_ref}`."
        )


class DecodeError(StreamappError):
    """A record is not a valid CloudEvent; ``reason`` is what a parking header carries."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class StoreLockedError(StreamappError):
    """Another process still holds a table partition's RocksDB directory."""

    retriable = True


class PublishError(StreamappError):
    """A sink could not confirm a publish; the outcome is unknown, publish again."""

    retriable = True


class BrokerUnavailableError(StreamappError):
    """The broker did not answer within the start-up retry budget."""

    retriable = True


class StoreFormatError(StreamappError):
    """A table store was written in a layout this streamapp does not read."""


class StoreClosedError(StreamappError):
    """A table partition was closed (revoked) while something still read it."""


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

    def __init__(self, stream_id: str, expected: int, actual: int, detail: str = "") -> None:
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
        why = f" ({detail})" if detail else ""
        super().__init__(
            f"stream {stream_id!r}: expected version {expected}, actual version {actual}"
            f"{why}; nothing appended. Read the stream again, then append with "
            f"expected version {actual}."
        )


class InvalidEventError(StreamappError):
    """An event cannot be appended as given (e.g. its streamid names another stream)."""


class ShutdownTimeoutError(StreamappError):
    """A worker did not finish draining within ``shutdown_timeout_s``."""
