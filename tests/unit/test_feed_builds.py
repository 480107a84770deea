"""The one event-store feed serves whole partitions before lanes that build beside live
ones: a partition catching up is released at the store's head without waiting for a
building lane's share, however slow that lane is."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from streamapp import Event
from streamapp.catchup import StoreFeed
from streamapp.engine.attempts import Attempts
from streamapp.eventstore import Append, open_store
from streamapp.records import Delivery
from streamapp.topics import TopicSpec


class Member:
    """A partition (or a building lane) as the feed sees it: applies its share at once,
    or, given ``gate``, only once the gate opens."""

    def __init__(self, name: str, *, building: bool, gate: asyncio.Event | None = None):
        self.name, self.building, self._gate = name, building, gate
        self.topic, self.partition = TopicSpec("t", 1), 0
        self.position, self.replayed, self.catching_up = 1, 0, True
        self.live = self.stopped = False

    def history_position(self) -> int:
        return self.position

    async def apply_history(
        self, deliveries: Sequence[Delivery], next_position: int, start: int
    ) -> bool:
        if self._gate is not None:
            await self._gate.wait()
        self.replayed += len(deliveries)
        self.position = next_position
        return True

    def retry_pause_s(self) -> float:
        return 0.01

    def failing(self) -> list[Attempts]:
        return []

    def stuck(self, on: dict[str, object] | None) -> None:
        pass

    def follow(self, on: bool) -> None:
        pass


async def test_a_partition_is_released_before_a_building_lane_applies_its_share(
    tmp_path: Path,
) -> None:
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    await store.append_many(
        [Append(f"s{i}", [Event.create("x", stream_id=f"s{i}")]) for i in range(50)]
    )
    feed = StoreFeed(store, poll_s=0.01)
    gate = asyncio.Event()
    building = Member("orders[0] (building v2)", building=True, gate=gate)
    whole = Member("orders[1]", building=False)
    feed.start()
    try:
        build = asyncio.create_task(feed.catch_up(building))  # joined first
        await asyncio.sleep(0)
        await asyncio.wait_for(feed.catch_up(whole), 5)  # not held by the gated lane
        assert whole.replayed == 50
        assert not build.done()
        assert building.replayed == 0
        gate.set()
        await asyncio.wait_for(build, 5)
        assert building.replayed == 50
    finally:
        gate.set()
        await feed.stop()
        await store.close()
