"""The ``event_store`` setting's URL: which backend, and where (a leaf: settings checks it
at start, the event-store backends open what it names)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

SETTING = "event_store (STREAMAPP_EVENT_STORE)"


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """A parsed ``event_store`` URL: a SQLite file (absolute path) or a PostgreSQL DSN."""

    kind: str
    """``sqlite`` or ``postgresql``."""
    path: Path | None = None
    dsn: str = ""
    create: bool = dataclasses.field(default=False, compare=False)
    """SQLite: make the file's missing directories (``?create=1``); without it a missing
    directory is refused (a typo would otherwise make an empty store somewhere else)."""


CREATE_QUERIES = ("create=1", "create=true")


def parse_url(url: str) -> StoreUrl:
    """``sqlite:///relative.db`` (from the working directory), ``sqlite:////abs.db``
    (either with ``?create=1`` to make missing directories) or ``postgresql://...``;
    anything else is a ConfigError naming the setting."""
    if url.startswith(("postgresql://", "postgres://")):
        return StoreUrl("postgresql", dsn=url)
    if url.startswith("sqlite:///"):
        raw, _, query = url.removeprefix("sqlite:///").partition("?")
        create = query in CREATE_QUERIES
        if (
            raw
            and (create or not query)
            and "?" not in query
            and not raw.endswith("/")
            and raw != ":memory:"
        ):
            path = Path.cwd() / raw if raw[0] != "/" else Path(raw)
            return StoreUrl("sqlite", path=path, create=create)
        why = "give a file path after sqlite:/// (no :memory:; the only query is ?create=1)"
    else:
        why = (
            "give sqlite:///relative/path.db, sqlite:////absolute/path.db or "
            "postgresql://user@host/db"
        )
    raise ConfigError(f"setting {SETTING} = {url!r}: {why}")
