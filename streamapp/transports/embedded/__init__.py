"""The event store as the only source (``STREAMAPP_BROKER=none``), a transport of its own.

Its package sits beside ``kafka/``, ``rabbitmq/`` and ``memory/``: it runs partition
tasks over the event-store backends of :mod:`streamapp.eventstore`, which stay below
the engine (catch-up, the forwarder and the command line read them too).
"""
