"""The model of the table-versions app: each key's exact v1 and v2 values at a position.

The store is the truth: every event the tests append goes through :meth:`FoldModel.add`
(in append order, which is each stream's order: one appender per key), and
:meth:`FoldModel.value` folds a key's first ``n`` events with the app's own fold of a
version (:data:`tests.apps.versions_app.FOLDS`). A key's stream version ``n`` is the
store position a view answer implies for that key (an answer's ``n`` says how many of
its events it applied). :meth:`FoldModel.check` judges one answer: exact when it equals
the fold at SOME ``n`` between what the reader had seen of that key before the request
and what was appended for it after the answer came (monotonic per key). It cannot pass a
wrong value: the value names its ``n`` and its last event id, and the whole value must
equal the fold at that ``n``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from streamapp import Event
from tests.apps.versions_app import FOLDS


@dataclass
class FoldModel:
    """Each key's events in stream order, and the folds of them by version."""

    events: dict[str, list[Event]] = field(default_factory=dict)
    _cache: dict[tuple[int, str], tuple[int, Any]] = field(default_factory=dict)

    def add(self, events: Iterable[Event]) -> None:
        """Record ``events`` as appended (call it before the append: the head after an
        answer is then never below what the store has)."""
        for event in events:
            assert event.stream_id is not None
            self.events.setdefault(event.stream_id, []).append(event)

    def head(self, key: str) -> int:
        """Events appended (or being appended) to ``key``'s stream."""
        return len(self.events.get(key, ()))

    def streams(self) -> list[str]:
        """Every key, sorted."""
        return sorted(self.events)

    def value(self, version: int, key: str, n: int) -> Any:
        """The fold of version ``version`` over the first ``n`` events of ``key``."""
        stream = self.events[key]
        assert 0 < n <= len(stream), (key, n, len(stream))
        done, value = self._cache.get((version, key), (0, None))
        if done > n:
            done, value = 0, None
        fold = FOLDS[version]
        for event in stream[done:n]:
            value = fold(value, event)
        self._cache[(version, key)] = (n, value)
        return value

    def check(self, version: int, key: str, value: Any, seen: int, head: int) -> str | None:
        """Why ``value`` (an answer of table version ``version`` for ``key``) is not exact,
        or None. ``seen``: the stream version the reader had seen of ``key`` before the
        request; ``head``: events appended to ``key`` once the answer came."""
        if version not in FOLDS:
            return f"version {version} is not a version of the app"
        if not isinstance(value, dict) or not isinstance(value.get("n"), int):
            return f"not a value of the app: {value!r}"
        n = value["n"]
        if n < seen:
            return f"stale: stream version {n}, the reader had seen {seen}"
        if n > head:
            return f"from the future: stream version {n}, only {head} appended"
        if n < 1:
            return f"stream version {n}"
        expected = self.value(version, key, n)
        if value != expected:
            return f"not the v{version} fold at stream version {n}: {value!r} != {expected!r}"
        return None
