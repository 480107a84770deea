"""The membership heartbeat on the wire: one JSON object per beat (:mod:`.members`).

A beat says who the member is (``member``, its sequence number ``seq``), where its views
answer (``url``), the partitions it holds, the contests it counted, whether it leaves,
and its table versions (:mod:`streamapp.versions.states`; a beat without them, from an
older streamapp, declares version 1 of each table live on the partitions it holds).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import orjson

from ...app import App
from ...engine.served import old_declared
from ...versions.states import MemberTables, encode_member, parse_member


@dataclass(frozen=True, slots=True)
class Beat:
    """One member's heartbeat as heard."""

    member: str
    seq: int
    url: str | None
    held: frozenset[tuple[str, int]]
    contested: dict[tuple[str, int], int]
    leaving: bool
    tables: MemberTables | None


def encode_beat(
    member: str,
    seq: int,
    url: str | None,
    held: Iterable[tuple[str, int]],
    contests: Mapping[tuple[str, int], int],
    tables: MemberTables | None,
    *,
    leaving: bool = False,
) -> bytes:
    """The body of a heartbeat."""
    return orjson.dumps(
        {
            **({} if tables is None else encode_member(tables)),
            "member": member,
            "seq": seq,
            "url": url,
            "held": sorted(held),
            "contested": [[t, p, n] for (t, p), n in sorted(contests.items())],
            "leaving": leaving,
        }
    )


def decode_beat(body: bytes, app: App) -> Beat:
    """A heartbeat's body as a :class:`Beat` (any error: the beat is malformed)."""
    beat = orjson.loads(body)
    member, held = str(beat["member"]), beat.get("held") or []
    heard = frozenset((str(t), int(p)) for t, p in held)
    return Beat(
        member=member,
        seq=int(beat.get("seq") or 0),
        url=beat.get("url"),
        held=heard,
        contested={(str(t), int(p)): int(n) for t, p, n in beat.get("contested") or []},
        leaving=bool(beat.get("leaving")),
        tables=parse_member(member, beat, old_declared(app, heard)),
    )
