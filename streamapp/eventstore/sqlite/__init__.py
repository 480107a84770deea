"""The SQLite event store: the store (:mod:`.store`), its schema (:mod:`.schema`) and the
forwarder's reads of it (:mod:`.forwarder`)."""
