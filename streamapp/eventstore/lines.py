"""Appending JSON lines (one structured CloudEvent each) to a store: ``streamapp store append``.

Consecutive good lines go to the store in one transaction per chunk, for speed. The per-line
rule still holds: input stops at the first bad line, nothing of it (or after it) is
appended, and every line before it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..codecs.structured import from_json
from ..errors import DecodeError
from .base import EventStoreBackend
from .model import Append, OnDuplicate


@dataclass(frozen=True, slots=True)
class LinesReport:
    """How an input went: events appended, events skipped as already stored, and the
    first bad line with why, if any."""

    appended: int
    bad_line: int | None = None
    reason: str = ""
    skipped: int = 0


async def append_lines(
    store: EventStoreBackend,
    lines: Iterable[bytes],
    *,
    chunk: int = 2000,
    on_duplicate: OnDuplicate = "skip",
) -> LinesReport:
    """Append each line's event to its stream (``streamid``, else ``subject``).

    A line without ``streamversion`` gets the stream's next version; one with it must be
    that next version (its expected version is ``streamversion - 1``). Blank lines are
    skipped, and so are events already stored (same ``source`` and ``id``: appending a
    file again appends nothing), or with ``on_duplicate="fail"`` the first is a bad line.
    """
    pending: list[Append] = []
    numbers: list[int] = []
    appended = skipped = 0

    async def flush() -> LinesReport | None:
        nonlocal appended, skipped
        if not pending:
            return None
        result = await store.append_many(pending, on_duplicate=on_duplicate)
        appended += len(result.results) - result.skipped  # one event per append
        skipped += result.skipped
        failed = result.error
        pending.clear()
        if failed is not None:
            line = numbers[len(result.results)]
            return LinesReport(appended, line, str(failed), skipped)
        numbers.clear()
        return None

    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            event = from_json(line)
        except DecodeError as exc:
            reason = exc.reason
        else:
            stream_id = event.stream_id
            if stream_id is not None:
                pending.append(Append(stream_id, [event]))
                numbers.append(number)
                if len(pending) >= chunk and (stopped := await flush()) is not None:
                    return stopped
                continue
            reason = f"event {event.id} has no stream id: set its streamid extension (or subject)"
        return await flush() or LinesReport(appended, number, reason, skipped)
    return await flush() or LinesReport(appended, skipped=skipped)
