"""The PostgreSQL event store: the store (:mod:`.store`), its connections
(:mod:`.session`) and its advisory locks (:mod:`.locks`)."""
