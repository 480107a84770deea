"""The relay's window: due copies come out in due order (ties by offset), whatever their
offsets, and the commit offset never passes a copy not yet republished."""

from __future__ import annotations

from streamapp.transports.kafka.window import DueWindow


def test_due_copies_come_out_in_due_order_and_the_commit_stops_at_the_first_held() -> None:
    window: DueWindow[str] = DueWindow(bound=10)
    assert window.commit_at is None
    window.add(0, 30_000, "long")
    window.add(1, 500, "short-a")
    window.add(3, 400, "short-b")  # offset 2 is a transaction marker: gaps are fine
    window.add(4, 500, "short-c")
    assert window.next_due() == 400
    assert window.take_due(100) == []
    taken = window.take_due(1_000)
    assert taken == [(3, "short-b"), (1, "short-a"), (4, "short-c")]  # due, then offset
    assert window.commit_at == 0  # taken, not yet confirmed
    window.done(o for o, _ in taken)
    assert window.commit_at == 0  # the long one (offset 0) still waits
    assert len(window) == 1
    assert window.next_due() == 30_000
    assert window.take_due(30_000) == [(0, "long")]
    window.done([0])
    assert window.commit_at == 5
    assert len(window) == 0


def test_a_failed_republish_holds_the_commit_and_comes_out_again_later() -> None:
    window: DueWindow[str] = DueWindow(bound=10)
    window.add(7, 100, "a")
    window.add(8, 200, "b")
    taken = window.take_due(300)
    window.done([8])
    window.put_back([t for t in taken if t[0] == 7], due_ms=1_300)
    assert window.commit_at == 7
    assert window.take_due(1_000) == []
    assert window.take_due(1_300) == [(7, "a")]
    window.done([7])
    assert window.commit_at == 9


def test_the_window_is_bounded_and_ignores_offsets_read_again() -> None:
    window: DueWindow[int] = DueWindow(bound=2)
    assert window.add(0, 10, 0)
    assert window.add(1, 10, 1)
    assert window.full
    assert not window.add(1, 10, 1)  # read again after a seek: already held
    window.skip(2)  # not a chain copy: nothing to republish
    window.done(o for o, _ in window.take_due(10))
    assert not window.full
    assert window.commit_at == 3
