"""Which table versions this process knows are retired: a leaf module, so that every
layer (the views' engine side included) asks the same question of the same place.

A worker's :class:`~streamapp.versions.ledger.RetirementWatch` fills it from the app's ledger
at start and as retirements come (``streamapp retire``)."""

from __future__ import annotations

from collections.abc import Iterable

TableVersion = tuple[str, int]
"""``(table name, version)``: a table version's identity."""

_RETIRED: dict[str, frozenset[TableVersion]] = {}


def is_retired(app_id: str, table: str, version: int) -> bool:
    """Whether this process learned that ``table`` version ``version`` of app ``app_id``
    was retired: the one question views ask for state ``retired``."""
    return (table, version) in _RETIRED.get(app_id, frozenset())


def retired_versions(app_id: str) -> frozenset[TableVersion]:
    """Every table version of ``app_id`` this process learned was retired."""
    return _RETIRED.get(app_id, frozenset())


def learn(app_id: str, retired: Iterable[TableVersion]) -> None:
    """Record retirements this process heard of (retirements are never undone)."""
    _RETIRED[app_id] = _RETIRED.get(app_id, frozenset()) | frozenset(retired)
