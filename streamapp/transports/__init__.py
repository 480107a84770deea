"""Transports: one package per broker (:mod:`.kafka`, :mod:`.rabbitmq`, :mod:`.embedded`:
the event store alone, ``STREAMAPP_BROKER=none``), the interface and the registry that
picks one by setting broker (:mod:`.base`), and start-up retries (:mod:`.startup`)."""
