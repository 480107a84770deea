"""A worker's transactional id, kept with its data directory (setting ``data_dir``).

The worker's one transactional writer (:mod:`.txn_writer`) commits under this id; keeping
it across restarts lets a worker started again after a crash end its previous life's open
transaction at once.
"""

from __future__ import annotations

import fcntl
import logging
import os
import uuid
from pathlib import Path
from typing import IO

log = logging.getLogger("streamapp.partition")


class WorkerId:
    """The worker's transactional id, stable for its data directory: a worker started
    again after a crash ends its previous life's open transaction at once (its
    ``InitProducerId``), where a new id would leave it to the broker's timeout. The id
    is kept in ``<data_dir>/<app id>/transactional-id`` under an exclusive lock: a second
    worker on the same directory gets an id of its own (never two live writers of one
    id, which would fence each other)."""

    def __init__(self, data_dir: Path, app_id: str) -> None:
        self.path = data_dir / app_id / "transactional-id"
        self._file: IO[str] | None = None

    def acquire(self) -> str:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            f = open(self.path, "a+")  # noqa: SIM115  # held open while the lock holds
        except OSError as exc:
            log.warning("%s cannot be kept (%r): a new transactional id", self.path, exc)
            return _fresh()
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            log.info("%s is held by another worker: a transactional id of its own", self.path)
            return _fresh()
        f.seek(0)
        known = f.read().strip()
        if not known:
            known = _fresh()
            f.write(known)
            f.flush()
            os.fsync(f.fileno())
        self._file = f
        return known

    def release(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            f.close()


def _fresh() -> str:
    return uuid.uuid4().hex[:16]
