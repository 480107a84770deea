"""Processes that create the same new SQLite store at once all open it (WAL switch race)."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path

from tests.support.waits import until_sync


def _open(path: str) -> None:
    from streamapp.eventstore import open_store

    async def run() -> None:
        store = await open_store(f"sqlite:///{path}")
        await store.close()

    asyncio.run(run())


def _all_exited(procs: list[multiprocessing.process.BaseProcess], what: str) -> None:
    """Until every process exited (joined); progress: how many have, one after another."""
    until_sync(
        lambda: all(p.exitcode is not None for p in procs),
        what=what,
        progress=lambda: sum(p.exitcode is not None for p in procs),
    )
    for p in procs:
        p.join()  # exited: at once


def test_six_processes_create_one_store_at_once(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    for round_ in range(3):
        path = str(tmp_path / f"events-{round_}.db")
        procs = [ctx.Process(target=_open, args=(path,)) for _ in range(6)]
        for p in procs:
            p.start()
        _all_exited(procs, f"six processes opened {path}")
        assert [p.exitcode for p in procs] == [0] * 6
