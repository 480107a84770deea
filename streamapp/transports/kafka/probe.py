"""Who runs an app on Kafka, asked of the broker (for ``streamapp reset``): the active
members of its consumer group, each with the worker its members topic names."""

from __future__ import annotations

from ...app import App
from ...settings.settings import Settings
from .admin import group_members, member_records


async def running_workers(app: App, settings: Settings) -> list[str]:
    """One line per active member of the app's group, naming the worker behind it."""
    members = await group_members(settings, settings.group_id)
    if not members:
        return []
    records = await member_records(settings, app.members_topic)
    out = []
    for m in members:
        owned = " ".join(f"{t}[{p}]" for t, p in sorted(m.partitions)) or "no partition"
        line = (
            f"consumer group {settings.group_id} on Kafka {settings.kafka_bootstrap}: member "
            f"{m.member_id} (client {m.client_id}, host {m.host}) owns {owned}"
        )
        workers = [
            f"{worker} (views {record.get('url')})"
            for worker, record in sorted(records.items())
            if record.get("member_id") == m.member_id
            or (m.partitions and _claimed(record) == m.partitions)
        ]
        if workers:
            line += f"; worker {', '.join(workers)} on topic {app.members_topic}"
        out.append(line)
    return out


def _claimed(record: dict[str, object]) -> frozenset[tuple[str, int]]:
    claims = record.get("partitions")
    if not isinstance(claims, list):
        return frozenset()
    out = set()
    for claim in claims:
        if isinstance(claim, list) and len(claim) >= 2:
            out.add((str(claim[0]), int(claim[1])))
    return frozenset(out)
