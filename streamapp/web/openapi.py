"""The OpenAPI 3.1 description of a worker's endpoints (``GET /openapi.json``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ..tables.table import Table
from .endpoint import MAX_KEY_BYTES
from .responses import VERSION_HEADER
from .scan import SCAN_LIMIT, SCAN_LIMIT_MAX
from .tables import MIN_VERSION_WAIT_S

TABLE_VERSION = {
    VERSION_HEADER: {
        "description": "The table version that served the answer, or would serve it.",
        "schema": {"type": "integer", "minimum": 1},
    }
}
"""The header every answer to a key or a scan carries (200s, 404s of a key, 503s)."""


def _json(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": {}}}}


def _errors(*codes: int) -> dict[str, Any]:
    why = {
        400: "Bad parameter.",
        401: "Bearer token missing or wrong (setting web_token).",
        404: "No such table, key or table version (`versions` names the versions there are).",
        414: f"Key or prefix longer than {MAX_KEY_BYTES} bytes.",
        421: "Another worker owns the key's partition and no owner directory is kept "
        "(no members topic), or the request was already forwarded.",
        422: "explain=1 / as_of: an event of the key's stream fails now in the handler.",
        503: "Rebalancing, or the partition (its lane of the table version) restores or "
        "catches up: retry after Retry-After.",
    }
    return {str(c): _json(why[c]) for c in codes}


def _versioned(responses: dict[str, Any]) -> dict[str, Any]:
    """``responses`` with the table version header on 200, 404 and 503."""
    for code in ("200", "404", "503"):
        if code in responses:
            responses[code] = {**responses[code], "headers": TABLE_VERSION}
    return responses


def _version_param() -> dict[str, Any]:
    return _param(
        "version",
        "query",
        {"type": "integer", "minimum": 1},
        "Pin a table version (default: the active one, live on every partition of the "
        "group). A version that does not exist answers 404 naming those that do; a "
        "partition of it not live yet answers 503 with Retry-After.",
    )


def _param(name: str, where: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": where,
        "required": where == "path",
        "schema": schema,
        "description": description,
    }


def table_schemas(tables: Sequence[Table[Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(paths, schemas)``: a ``/tables/{name}/{key}`` path per table whose value has a
    schema (``value_type=``: every version's, one of them when they differ), and the
    components those refer to. JSON tables (no value type) answer any JSON value."""
    typed = [t for t in tables if getattr(t.codec, "value_type", None) is not None]
    if not typed:
        return {}, {}
    refs, components = msgspec.json.schema_components(
        [t.codec.value_type for t in typed],  # type: ignore[attr-defined]
        ref_template="#/components/schemas/{name}",
    )
    by_name: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for t, ref in zip(typed, refs, strict=True):
        by_name.setdefault(t.name, []).append((t.version, ref))
    untyped = {t.name for t in tables} - set(by_name)
    paths: dict[str, Any] = {}
    for name, versions in sorted(by_name.items()):
        schemas = [ref for _, ref in sorted(versions, key=lambda v: v[0])]
        if name in untyped:
            schemas.append({})  # a version of it without value_type: any JSON value
        unique = [s for i, s in enumerate(schemas) if s not in schemas[:i]]
        schema = unique[0] if len(unique) == 1 else {"oneOf": unique}
        paths[f"/tables/{name}/{{key}}"] = {
            "get": {
                "summary": f"A key's committed value in table {name!r} (typed: "
                f"version(s) {', '.join(str(v) for v, _ in sorted(versions))}).",
                "parameters": [
                    _param("key", "path", {"type": "string"}, "The key (stream id)."),
                    _version_param(),
                ],
                "responses": _versioned(
                    {
                        "200": {
                            "description": "The value.",
                            "content": {"application/json": {"schema": schema}},
                        },
                        **_errors(400, 401, 404, 414, 421, 503),
                    }
                ),
            }
        }
    return paths, components


def document(app_id: str, version: str, tables: Sequence[Table[Any]] = ()) -> dict[str, Any]:
    """The document; ``tables``: the app's tables, whose value types it describes."""
    table = _param("table", "path", {"type": "string"}, "Table name.")
    typed_paths, schemas = table_schemas(tables)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": f"streamapp worker of app {app_id}",
            "version": version,
            "description": "Health, status, metrics and committed table state of one worker.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas,
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
                    "summary": "Partitions, phases, lag, outcomes, catch-up, the last loop stall, "
                    "sinks (publishes not confirmed), relays (held, lag), retry hops.",
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
            "/verify/report": {
                "post": {
                    "summary": "What `streamapp verify --report` found ({table, version, "
                    "differ, missing}): sets streamapp_verify_last_differences.",
                    "responses": {"200": _json("The differences recorded."), **_errors(400, 401)},
                }
            },
            "/tables": {
                "get": {
                    "summary": "Tables, partition counts, partitions owned here with phase, "
                    "and each table's versions: state (building, active, previous, retired), "
                    "live/total partitions, declared_by (workers), progress.",
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
                        _version_param(),
                    ],
                    "responses": _versioned(
                        {
                            "200": _json("`items` (key, value, partition) and the next `cursor`."),
                            **_errors(400, 401, 404, 414, 503),
                        }
                    ),
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
                            "1: answer {value, version (the table's), partition, phase, "
                            "stream_version, checkpoint}.",
                        ),
                        _param(
                            "explain",
                            "query",
                            {"type": "string", "enum": ["0", "1"]},
                            "1: the value folded from the event store through the handler, "
                            "with the events that made it (not live state).",
                        ),
                        _param(
                            "as_of",
                            "query",
                            {"type": "integer", "minimum": 1},
                            "The value the key had at this store position, folded from "
                            "the event store.",
                        ),
                        _param(
                            "limit",
                            "query",
                            {"type": "integer", "minimum": 1},
                            "With explain=1: list the last N events.",
                        ),
                        _version_param(),
                    ],
                    "responses": _versioned(
                        {
                            "200": _json(
                                "The value (X-Streamapp-Partition, -Phase, -Version (the "
                                "stream version), -Checkpoint headers)."
                            ),
                            **_errors(400, 401, 404, 414, 421, 422, 503),
                        }
                    ),
                }
            },
            **typed_paths,
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
