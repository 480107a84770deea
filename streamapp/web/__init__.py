"""HTTP views of a worker: table lookups and status."""
