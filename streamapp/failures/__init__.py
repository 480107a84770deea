"""Failures: an attempt's outcome and the agent's policy for it (:mod:`.outcomes`), the
retry chain's topics and headers (:mod:`.retry_chain`), and what parked or dead-lettered
copies look like when they are sent back (:mod:`.republish`). The transports' relays and
parking destinations implement these; the engine settles by them."""
