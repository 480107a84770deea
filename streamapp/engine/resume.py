"""Where a closing partition resumes, as its last log line says (and the next owner reads)."""

from __future__ import annotations

from collections.abc import Sequence

from .lane import Lane


def resume_points(lanes: Sequence[Lane], absolute: bool) -> str:
    """Where each lane of a closing partition resumes, as the next owner reads it: its
    checkpoint's live position (an absolute source), its store position while it was
    catching up or when the store is its only source (STREAMAPP_BROKER=none), or the
    queue (RabbitMQ: positions count one session's deliveries)."""
    points: dict[str, str] = {}
    for lane in lanes:
        tables, history = lane.tables, lane.agent.history is not None
        store = f"event-store position {lane.history_position()}"
        if history and tables is not None and not tables.checkpoint.caught_up:
            points[lane.name] = f"{store} (catch-up)"
        elif not absolute:
            points[lane.name] = f"{store}, then the queue" if history else "the queue"
        elif (live := _live(lane)) is not None:
            points[lane.name] = f"position {live}"
        elif history or (tables is not None and tables.checkpoint.history is not None):
            points[lane.name] = store  # the event store was its source (embedded mode)
        else:
            points[lane.name] = "the source's start (nothing committed)"
    if len(set(points.values())) == 1:
        return f"resumes from {next(iter(points.values()))}"
    return "resumes " + ", ".join(f"{name} from {point}" for name, point in points.items())


def _live(lane: Lane) -> int | None:
    """The live position a restart reads: the checkpoint's (tables), else the lane's
    committed one (the source's committed offset and its metadata)."""
    if lane.tables is not None:
        return lane.tables.checkpoint.live
    return lane.committed
