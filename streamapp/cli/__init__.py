"""The ``streamapp`` command: ``worker``, ``topics``, ``store``, ``forward``, ``tables``,
``agents``, ``reset``, ``retire``, ``parked`` (``replay``, ``release``, ``list --held``,
``skip``), ``dlq`` (``replay``), ``verify`` and ``versions`` (``diff``, ``switch``), one
module each.
``-A MODULE[:ATTRIBUTE]`` goes before or after the command."""

from . import (  # noqa: F401 (commands)
    agents,
    forward,
    parked,
    reset,
    retire,
    store,
    tables,
    topics,
    verify,
    versions,
    worker,
)
from .main import load_app, main

__all__ = ["load_app", "main"]
