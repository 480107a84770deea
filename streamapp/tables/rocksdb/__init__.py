"""The RocksDB driver of the table Store (:mod:`.store`)."""
