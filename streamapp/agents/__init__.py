"""Agents: a projection's handler and what it declares (:mod:`.agent`, its event-store
history :mod:`.history`), how its handler is called (:mod:`.binding`), what it may send
(:mod:`.outputs`), typed events (:mod:`.typed`) and re-keying (:mod:`.group_by`)."""
