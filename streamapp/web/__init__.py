"""HTTP face of a worker: health, status, metrics, table views (forwarded to owners),
security middlewares, the OpenAPI document and a small page."""
