"""The OpenAPI 3 description of the review API and the traffic endpoint.

Served unauthenticated at ``GET /openapi.json`` on the review port: it describes the
API, it holds no data. The traffic endpoint is described in the same document, under
its own server (``traffic_url``), and is not served on the traffic port: in proxy mode
every path there belongs to the upstream, and the mirror answers only what the live
path sends it.
"""

from __future__ import annotations

from typing import Any

from monitor import __version__
from monitor.core.review import (
    MAX_ACCEPTED_RANKS,
    MAX_CORRECT_ANSWER_CHARS,
    MAX_ITEM_ID_CHARS,
    MAX_REVIEWER_CHARS,
    MAX_VERDICT_BYTES,
)

__all__ = ["openapi_document"]

_JSON = "application/json"
_ITEM_ID = {
    "name": "item_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1},
    "description": (
        f"The review item's id, `<task>:<request id>`; a verdict for an id over "
        f"{MAX_ITEM_ID_CHARS} characters is refused (413)."
    ),
}
_SESSION = {
    "name": "session",
    "in": "query",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 64},
    "description": "The review page's session (1 to 64 printable characters).",
}


_REVIEWER = {
    "type": "string",
    "maxLength": MAX_REVIEWER_CHARS,
    "description": "Your name; a reviewer identified by the token or the proxy is recorded "
    "as such instead.",
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


_CONFLICT = {
    "description": "The item already has another verdict (the first stored one counts, "
    "from the page or the API alike): that verdict, and whether it is still held in the "
    "page's undo window.",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["error", "verdict", "held"],
                "properties": {
                    "error": {"type": "string"},
                    "verdict": {"type": "object"},
                    "held": {"type": "boolean"},
                    "score": {"oneOf": [{"type": "number"}, {"type": "string"}]},
                },
            }
        }
    },
}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Invalid input (a one-line message).",
        401: "Missing or wrong bearer token (review.auth: proxy: not from a trusted proxy, "
        "or no reviewer header).",
        403: "Another session gave this verdict: it stands.",
        404: "No such review item.",
        409: "Too late: the verdict has been applied, or the lease is not this session's.",
        413: f"Body over {MAX_VERDICT_BYTES} bytes, or a field over its limit (named).",
    }
    return {str(c): _json(_ref("Error"), text[c]) for c in codes}


_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string"}},
    },
    "Candidate": {
        "type": "object",
        "required": ["rank", "answer", "count"],
        "properties": {
            "rank": {"type": "integer", "minimum": 1},
            "answer": {"type": "string", "description": "Redacted as configured."},
            "count": {"type": "integer", "minimum": 1},
        },
    },
    "ReviewItem": {
        "type": "object",
        "required": ["item_id", "model", "task", "query", "candidates", "k"],
        "properties": {
            "item_id": {"type": "string"},
            "model": {"type": "string"},
            "task": {"type": "string"},
            "query": {"type": "string", "description": "Redacted as configured."},
            "candidates": {"type": "array", "items": _ref("Candidate")},
            "k": {"type": "integer", "minimum": 0},
            "inclusion_probability": {"type": "number"},
            "sampled_at": {"type": "number"},
            "thresholds": {"type": "object"},
            "api": {"type": "string", "description": "The wire API of the production call."},
        },
    },
    "Verdict": {
        "description": "Accept ranks, or none of these (optionally with the correct answer).",
        "oneOf": [
            {
                "type": "object",
                "required": ["accepted_ranks"],
                "properties": {
                    "accepted_ranks": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": MAX_ACCEPTED_RANKS,
                        "items": {"type": "integer", "minimum": 1},
                    },
                    "none_of_these": {"type": "boolean", "enum": [False]},
                    "reviewer": _REVIEWER,
                },
            },
            {
                "type": "object",
                "required": ["none_of_these"],
                "properties": {
                    "none_of_these": {"type": "boolean", "enum": [True]},
                    "correct_answer": {"type": "string", "maxLength": MAX_CORRECT_ANSWER_CHARS},
                    "reviewer": _REVIEWER,
                },
            },
        ],
    },
    "VerdictResult": {
        "type": "object",
        "required": ["status"],
        "properties": {
            "status": {"type": "string", "enum": ["applied", "duplicate"]},
            "score": {
                "description": 'The rank score; "inf" when no candidate was accepted.',
                "oneOf": [{"type": "number"}, {"type": "string", "enum": ["inf"]}],
            },
        },
    },
    "ContentPart": {
        "type": "object",
        "properties": {"type": {"type": "string"}, "text": {"type": "string"}},
    },
    "Message": {
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": {"type": "string"},
            "content": {
                "nullable": True,
                "oneOf": [
                    {"type": "string"},
                    {"type": "array", "items": _ref("ContentPart")},
                ],
            },
        },
    },
    "ChatCompletionRequest": {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            "model": {"type": "string", "minLength": 1},
            "messages": {"type": "array", "minItems": 1, "items": _ref("Message")},
            "response": {
                "type": "object",
                "description": "Mirror only: the model's answer, added by a log shipper.",
            },
        },
    },
}

_BEARER: list[dict[str, list[str]]] = [{"reviewToken": []}]


def _review_paths() -> dict[str, Any]:
    """The review API's paths, then the review page's."""
    return {**_review_api_paths(), **_review_page_paths()}


def _review_api_paths() -> dict[str, Any]:
    return {
        "/api/whoami": {
            "get": {
                "summary": "How this API authenticates, and the reviewer it names (or null).",
                "security": _BEARER,
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["auth", "reviewer"],
                            "properties": {
                                "auth": {"type": "string", "enum": ["token", "proxy"]},
                                "reviewer": {"type": "string", "nullable": True},
                            },
                        },
                        "The reviewer named by the token or the proxy; null: a shared token.",
                    ),
                    **_errors(401),
                },
            }
        },
        "/api/reviews/next": {
            "get": {
                "summary": "The oldest item waiting for a verdict (leased with a session).",
                "security": _BEARER,
                "parameters": [
                    {"name": "task", "in": "query", "schema": {"type": "string"}},
                    {"name": "session", "in": "query", "schema": {"type": "string"}},
                    {"name": "reviewer", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "exclude",
                        "in": "query",
                        "schema": {"type": "array", "items": {"type": "string"}},
                        "style": "form",
                        "explode": True,
                    },
                ],
                "responses": {
                    "200": _json(_ref("ReviewItem"), "The item."),
                    "204": {"description": "Nothing is waiting."},
                    "429": _json(
                        _ref("Error"),
                        "The reviewer holds review.max_leases_per_reviewer leases already "
                        "(Retry-After: the lease time).",
                    ),
                    **_errors(400, 401),
                },
            }
        },
        "/api/reviews/{item_id}": {
            "parameters": [_ITEM_ID],
            "get": {
                "summary": "An item and its verdict (null if none).",
                "security": _BEARER,
                "responses": {"200": _json(_ref("ReviewItem"), "The item."), **_errors(401, 404)},
            },
            "post": {
                "summary": "A verdict. The first stored verdict of an item counts: the same "
                "judgement again answers duplicate, another one 409.",
                "security": _BEARER,
                "requestBody": {"required": True, "content": {_JSON: {"schema": _ref("Verdict")}}},
                "responses": {
                    "200": _json(_ref("VerdictResult"), "Applied, or a duplicate."),
                    "409": _CONFLICT,
                    **_errors(400, 401, 404, 413),
                },
            },
        },
    }


def _review_page_paths() -> dict[str, Any]:
    return {
        "/api/review-page/verdicts/{item_id}": {
            "parameters": [_ITEM_ID, _SESSION],
            "post": {
                "summary": "Hold a verdict for the undo window.",
                "security": _BEARER,
                "requestBody": {"required": True, "content": {_JSON: {"schema": _ref("Verdict")}}},
                "responses": {
                    "200": _json({"type": "object"}, "The item already has this verdict."),
                    "202": _json({"type": "object"}, "Held for the undo window."),
                    "409": _CONFLICT,
                    **_errors(400, 401, 404, 413),
                },
            },
            "delete": {
                "summary": "Undo a held verdict; the item is leased back to the session.",
                "security": _BEARER,
                "responses": {
                    "200": _json({"type": "object"}, "Undone."),
                    **_errors(400, 401, 403, 409),
                },
            },
        },
        "/api/review-page/lease/{item_id}": {
            "parameters": [_ITEM_ID, _SESSION],
            "post": {
                "summary": "Renew the session's lease on an item (the page does every lease/3).",
                "security": _BEARER,
                "responses": {
                    "200": _json({"type": "object"}, "Renewed for lease_s seconds from now."),
                    **_errors(400, 401, 409),
                },
            },
        },
        "/api/review-page/release/{item_id}": {
            "parameters": [_ITEM_ID, _SESSION],
            "post": {
                "summary": "Give a leased item back (skip).",
                "security": _BEARER,
                "responses": {
                    "200": _json({"type": "object"}, "Whether a lease was released."),
                    **_errors(400, 401),
                },
            },
        },
        "/api/review-page/progress": {
            "get": {
                "summary": "Per task: reviewed today, waiting, calibration state.",
                "security": _BEARER,
                "responses": {"200": _json({"type": "object"}, "Progress."), **_errors(401)},
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document.",
                "security": [],
                "responses": {"200": _json({"type": "object"}, "OpenAPI 3 document.")},
            }
        },
    }


_TRAFFIC_PATHS: tuple[tuple[str, str, str | None], ...] = (
    ("/v1/chat/completions", "OpenAI Chat Completions", "ChatCompletionRequest"),
    ("/v1/responses", "OpenAI Responses", None),
    ("/v1/messages", "Anthropic Messages", None),
    ("/v1beta/models/{model}:generateContent", "Gemini generateContent", None),
    ("/v1/completions", "OpenAI legacy Completions", None),
)
"""The traffic port's wire APIs (docs/apis/): path, name, request schema (None: any
JSON object, as that API defines it)."""


def _traffic_operation(name: str, schema: str | None, servers: list[Any]) -> dict[str, Any]:
    body = _ref(schema) if schema is not None else {"type": "object"}
    parameters: list[dict[str, Any]] = [
        {"name": "X-Request-Id", "in": "header", "schema": {"type": "string"}},
        {"name": "X-Relmon-Task", "in": "header", "schema": {"type": "string"}},
    ]
    return {
        **({"servers": servers} if servers else {}),
        "post": {
            "summary": f"Mirror: a copy of a {name} request (any path prefix).",
            "description": (
                "Answered 202 as soon as the body is read; the body is parsed only "
                "afterwards, and a malformed one is counted as rejected "
                '(relmon_traffic_events_total{decision="rejected"}), never answered '
                "with an error. In proxy mode the request goes to the upstream and "
                "its answer comes back unchanged. No authentication: bind the port "
                "to a private address."
            ),
            "security": [],
            "parameters": parameters,
            "requestBody": {"required": True, "content": {_JSON: {"schema": body}}},
            "responses": {
                "202": _json({"type": "object"}, "Accepted (mirror)."),
                "400": _json({"type": "object"}, "The body was cut short."),
                "413": _json({"type": "object"}, "Body over traffic.max_body_bytes."),
            },
        },
    }


def _traffic_paths(traffic_url: str | None) -> dict[str, Any]:
    servers = [{"url": traffic_url, "description": "the traffic port"}] if traffic_url else []
    paths = {
        path: _traffic_operation(name, schema, servers) for path, name, schema in _TRAFFIC_PATHS
    }
    gemini = paths["/v1beta/models/{model}:generateContent"]["post"]
    gemini["parameters"] = [
        *gemini["parameters"],
        {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}},
    ]
    return paths


def openapi_document(*, traffic_url: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.0 document; ``traffic_url`` is where the traffic endpoint listens
    (omitted: the traffic endpoint is off, and not described)."""
    paths = _review_paths()
    if traffic_url is not None:
        paths |= _traffic_paths(traffic_url)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "relmon",
            "version": __version__,
            "description": (
                "The review API (bearer token on every /api route) and the traffic "
                "endpoint (mirror or proxy) of relmon."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"reviewToken": {"type": "http", "scheme": "bearer"}},
        },
    }
