"""The members directory: the newest claim of a partition wins; tombstones forget."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from streamapp.engine.assignment import Assignment
from streamapp.kafka.members import KafkaMembers

from .webworld import orders_app


class Published:
    """A publisher that keeps what it is given (the members record writer's sink)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []

    async def publish(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> None:
        self.sent.append((topic, value, key))


def _record(worker: str, url: str, *claims: tuple[str, int, int]) -> bytes:
    return orjson.dumps({"worker": worker, "url": url, "partitions": [list(c) for c in claims]})


async def test_newest_claim_wins_and_tombstones_forget() -> None:
    app = orders_app()
    members = KafkaMembers(
        app, app.settings(), Assignment(app), "me", Published()
    )  # not started: no broker asked
    assert members.topic == "webapp-members"
    members._apply(b"old", _record("old", "http://old:1", ("orders", 0, 100), ("orders", 1, 100)))
    members._apply(b"new", _record("new", "http://new:1", ("orders", 0, 200)))
    assert members.owner_url("orders", 0) == "http://new:1"  # took it over later
    assert members.owner_url("orders", 1) == "http://old:1"
    assert members.owner_url("orders", 2) is None
    members._since[("orders", 1)] = 300  # this worker claimed it after "old"
    assert members.owner_url("orders", 1) is None  # ours: never forward to ourselves
    members._apply(b"new", None)  # "new" left
    assert members.owner_url("orders", 0) == "http://old:1"
    members._apply(b"me", _record("me", "http://me:1", ("orders", 3, 999)))  # our own echo
    assert members.owner_url("orders", 3) is None
    members._apply(b"bad", b"not json")
    assert "bad" not in members.members


async def test_the_record_names_url_and_claims() -> None:
    app = orders_app()
    sink = Published()
    members = KafkaMembers(app, app.settings(), Assignment(app), "me", sink)
    members.url = "http://me:1"
    members._since = {("orders", 2): 123}
    await members._publish()
    ((topic, value, key),) = sink.sent
    assert (topic, key) == ("webapp-members", b"me")
    assert value is not None
    body = orjson.loads(value)
    assert body["url"] == "http://me:1"
    assert body["partitions"] == [["orders", 2, 123]]
