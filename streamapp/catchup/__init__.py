"""Catch-up: the event store read into partition tasks before they go live
(:mod:`.feed`, one reader for every lane), its progress (:mod:`.progress`), and the
forwarder, the outbox relay that carries appended events to the broker
(:mod:`.forwarder`). The task's side of the handover is :mod:`streamapp.engine.replay`."""
