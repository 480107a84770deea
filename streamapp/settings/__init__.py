"""The settings: one frozen object validated at start (:mod:`.settings`), the store URL
grammar (:mod:`.store_url`) and the worker's event loop (:mod:`.event_loop`)."""

from .settings import Backoff, Settings

__all__ = ["Backoff", "Settings"]
