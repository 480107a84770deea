"""Which table versions declared ``switch="manual"`` this process knows were switched to
(``streamapp versions switch``): a leaf module, as :mod:`.retired` is, so that the
views' engine side asks the same place. A worker's ledger watch
(:class:`~streamapp.versions.ledger.RetirementWatch`) fills it at start and as
switches come; a switch is never undone (the switch is one-way)."""

from __future__ import annotations

from collections.abc import Iterable

from .retired import TableVersion

_SWITCHED: dict[str, frozenset[TableVersion]] = {}


def switched_versions(app_id: str) -> frozenset[TableVersion]:
    """Every manual table version of ``app_id`` this process learned was switched to."""
    return _SWITCHED.get(app_id, frozenset())


def learn_switches(app_id: str, switched: Iterable[TableVersion]) -> None:
    """Record switches this process heard of."""
    _SWITCHED[app_id] = _SWITCHED.get(app_id, frozenset()) | frozenset(switched)
