"""Promoted standbys' stores (``streamapp.transports.kafka.standby.PromotedStores``): a
task takes its own once; what no task took is closed, once, and never handed out after."""

from __future__ import annotations

import threading
from pathlib import Path

from streamapp.settings.settings import Settings
from streamapp.tables.store import Store, rocks_opener
from streamapp.transports.kafka.standby import PromotedStores


def _store(tmp_path: Path, agent: str, partition: int) -> Store:
    settings = Settings("app", data_dir=tmp_path)
    return rocks_opener(settings, "app", agent, partition)([agent, "meta"])


async def test_a_task_takes_its_partitions_store_once(tmp_path: Path) -> None:
    store = _store(tmp_path, "tally", 3)
    promoted = PromotedStores()
    promoted.add({("orders", 3, "tally"): store})
    assert promoted.take("orders", 3, "other") is None
    assert promoted.take("orders", 2, "tally") is None
    assert promoted.take("orders", 3, "tally") is store
    assert promoted.take("orders", 3, "tally") is None
    store.write({"tally": {b"k": b"v"}})  # open: the task goes on with it
    await promoted.close()  # not this one: the task took it
    assert store.get("tally", b"k") == b"v"
    store.close()


async def test_what_no_task_took_is_closed_and_its_directory_opens_again(tmp_path: Path) -> None:
    promoted = PromotedStores()
    promoted.add({("orders", p, "tally"): _store(tmp_path, "tally", p) for p in range(3)})
    await promoted.close()
    assert promoted.take("orders", 0, "tally") is None  # never handed out after the close
    for p in range(3):  # the RocksDB locks are free: a task opens the directories itself
        _store(tmp_path, "tally", p).close()


async def test_takes_from_other_threads_get_each_store_once(tmp_path: Path) -> None:
    promoted = PromotedStores()
    stores = {("orders", p, "tally"): _store(tmp_path, "tally", p) for p in range(8)}
    promoted.add(stores)
    taken: list[Store] = []

    def take_all() -> None:
        for p in range(8):
            store = promoted.take("orders", p, "tally")
            if store is not None:
                taken.append(store)

    threads = [threading.Thread(target=take_all) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(map(id, taken)) == sorted(map(id, stores.values()))
    for store in taken:
        store.close()
