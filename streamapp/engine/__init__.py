"""The engine: one partition task per source partition, the same for every transport.

It opens a partition's stores, restores, runs batches through the agents, commits in
the one order of :mod:`.commit` and settles at the source through the port a transport
gives it (:mod:`.port`). Nothing here imports a client library.
"""
