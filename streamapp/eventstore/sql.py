"""SQL both backends run as written (SQLite's ``?`` parameters; PostgreSQL replaces
them with ``%s``), and what they log about it."""

from __future__ import annotations

import logging

log = logging.getLogger("streamapp.eventstore")

LIVE_OFFSET_SQL = (
    "SELECT min(kafka_offset) FROM ("
    "SELECT name, max(kafka_offset) AS kafka_offset FROM streamapp_forwarder_marks "
    "WHERE topic = ? AND kafka_partition = ? AND position < ? GROUP BY name) AS latest"
)
"""Where live delivery may start after a replay that applied every position below P.

A forwarder publishes in store order and records, after each confirmed chunk, a mark
per topic partition: the highest offset and the store position that record carried. A
forwarder restarted from its checkpoint publishes again from there, so every position
at or above P that it publishes comes after its own latest mark below P. Forwarders of
other names (one runs at a time) leave marks of their own: taking the lowest of each
name's latest mark below P, then offset + 1, misses nothing whichever name goes on, and
re-reads about one chunk of what the replay applied (the stream-version rule skips it).
No mark (a new topic, or a forwarder that has not run): the task starts at the
beginning of the topic, whatever ``auto_offset_reset`` says."""


DUPLICATES_NOTE = (
    "these rows stay (the store never deletes); appends skip or refuse those ids from now on"
)
STORED_TWICE_SQL = (
    "SELECT count(*) FROM (SELECT 1 FROM streamapp_events GROUP BY source, event_id "
    "HAVING count(*) > 1) AS twice"
)
"""SQL counting the ``(source, id)`` keys stored more than once (both backends)."""


def log_indexed(url: str, twice: int) -> None:
    """Say that a store made before duplicate checks was indexed, and how many of its
    events were stored more than once already (they stay)."""
    log.info("event store %s: events indexed by (source, id) for duplicate checks", url)
    if twice:
        log.warning(
            "event store %s: %d events (source, id) were already stored more than once; %s",
            url,
            twice,
            DUPLICATES_NOTE,
        )


STREAM_IDS_SQL = (
    "SELECT DISTINCT stream_id FROM streamapp_events WHERE stream_id > ? ORDER BY stream_id LIMIT ?"
)
"""A page of stream ids, by the unique index on (stream_id, version)."""
SAMPLE_STREAMS_SQL = (
    "SELECT stream_id FROM (SELECT DISTINCT stream_id FROM streamapp_events) AS streams "
    "ORDER BY random() LIMIT ?"
)
"""``k`` stream ids at random: one pass over the index, a top-k sort."""
