"""The OpenAPI 3.1 description of a worker's endpoints (``GET /openapi.json``)."""

from __future__ import annotations

from typing import Any

from .tables import MAX_KEY_BYTES, MIN_VERSION_WAIT_S, SCAN_LIMIT, SCAN_LIMIT_MAX


def _json(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {}}}}


def _errors(*codes: int) -> dict[str, Any]:
    why = {
        400: "Bad parameter.",
        401: "Bearer token missing or wrong (setting web_token).",
        404: "No such table or key.",
        414: f"Key or prefix longer than {MAX_KEY_BYTES} bytes.",
        421: "Another worker owns the key's partition and no owner directory is kept "
        "(no members topic), or the request was already forwarded.",
        503: "Rebalancing, or the partition restores or catches up: retry after Retry-After.",
    }
    return {str(c): _json(why[c]) for c in codes}


def _param(name: str, where: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "schema": schema,
        "description": description,
    }


def document(app_id: str, version: str) -> dict[str, Any]:
    table = _param("table", "path", {"type": "string"}, "Table name.")
    return {
        "openapi": "3.1.0",
        "info": {
            "title": f"streamapp worker of app {app_id}",
            "version": version,
            "description": "Health, status, metrics and committed table state of one worker.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/healthz": {
                "get": {
                    "summary": "The process answers (no token needed).",
                    "security": [],
                    "responses": {"200": _json("Alive.")},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "Every assigned partition is live and no rebalance runs.",
                    "responses": {
                        "200": _json("Ready."),
                        "503": _json("Not ready: `not_live` names partitions and phases."),
                        **_errors(401),
                    },
                }
            },
            "/status": {
                "get": {
                    "summary": "Agents, partitions, phases, lag, outcomes, catch-up progress.",
                    "responses": {"200": _json("Status."), **_errors(401)},
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus text format.",
                    "responses": {
                        "200": {
                            "description": "Metrics.",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        **_errors(401),
                    },
                }
            },
            "/tables": {
                "get": {
                    "summary": "Tables, partition counts, partitions owned here with phase.",
                    "responses": {"200": _json("Tables."), **_errors(401)},
                }
            },
            "/tables/{table}": {
                "get": {
                    "summary": "A page of the table's items merged across the workers, in "
                    "partition then key order.",
                    "parameters": [
                        table,
                        _param("prefix", "query", {"type": "string"}, "Keys starting with."),
                        _param(
                            "limit",
                            "query",
                            {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": SCAN_LIMIT_MAX,
                                "default": SCAN_LIMIT,
                            },
                            "Items per page.",
                        ),
                        _param("cursor", "query", {"type": "string"}, "From the last page."),
                    ],
                    "responses": {
                        "200": _json("`items` (key, value, partition) and the next `cursor`."),
                        **_errors(400, 401, 404, 414, 503),
                    },
                }
            },
            "/tables/{table}/{key}": {
                "get": {
                    "summary": "The key's committed value, from its owner (forwarded when "
                    "another worker owns the partition: X-Streamapp-Forwarded-To).",
                    "parameters": [
                        table,
                        _param("key", "path", {"type": "string"}, "The key (stream id)."),
                        _param(
                            "min_version",
                            "query",
                            {"type": "integer", "minimum": 0},
                            "Wait (at most "
                            f"{MIN_VERSION_WAIT_S:.0f} s) until the key's committed stream "
                            "version reaches this.",
                        ),
                        _param(
                            "meta",
                            "query",
                            {"type": "string", "enum": ["0", "1"]},
                            "1: answer {value, partition, phase, version, checkpoint}.",
                        ),
                    ],
                    "responses": {
                        "200": _json(
                            "The value (X-Streamapp-Partition, -Phase, -Version, "
                            "-Checkpoint headers)."
                        ),
                        **_errors(400, 401, 404, 414, 421, 503),
                    },
                }
            },
            "/openapi.json": {
                "get": {"summary": "This document.", "responses": {"200": _json("OpenAPI.")}}
            },
            "/": {
                "get": {
                    "summary": "A small page: tables, key lookup, partitions and phases. Give "
                    "the token as #token=... in the URL.",
                    "security": [],
                    "responses": {"200": {"description": "HTML.", "content": {"text/html": {}}}},
                }
            },
        },
    }
