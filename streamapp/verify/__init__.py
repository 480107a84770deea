"""Proof of a projection from its event store: a key's stream folded again through the
app's handler in scratch (:mod:`.fold`), to explain a value event by event and to answer
the value a key had at a store position. Nothing here reads or writes live state."""
