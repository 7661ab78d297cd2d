"""What every answer from the node must look like, whatever it was sent (spec §2.4, §3.5).

The table is copied from the spec rather than imported from ``hearthnet.errors``, so a
code added to the implementation without the spec fails here.
"""

from __future__ import annotations

from typing import Any

import orjson

# spec §2.4: the closed set of error codes and the HTTP status of each.
HTTP_STATUS = {
    "bad_request": 400,
    "schema_mismatch": 400,
    "payload_too_large": 413,
    "invalid_signature": 401,
    "unauthorized": 401,
    "revoked": 403,
    "forbidden": 403,
    "not_found": 404,
    "timeout": 408,
    "expired": 410,
    "replayed": 409,
    "rate_limited": 429,
    "capacity_exceeded": 429,
    "upgrade_required": 426,
    "internal_error": 500,
    "unavailable": 503,
    "cancelled": 499,
}
# spec §2.5: too many headers is payload_too_large carried by 431.
EXTRA_STATUS = {("payload_too_large", 431)}
# A fuzzer's input is never a reason for a bug report from the node.
NEVER = {"internal_error"}
# WebSocket close codes a node may use on hostile input: normal, going away, unsupported
# data (1003: binary on the JSON subprotocol, text on CBOR), policy (1008), too big
# (1009), and the application codes of spec §3.6 / §6.8 (4xxx).
# 1011 is "internal error" and never acceptable.
CLOSE_CODES_OK = {1000, 1001, 1003, 1008, 1009} | set(range(4000, 5000))


def error_code(obj: object, where: str) -> str:
    """The code of a spec §2.2 error body or §2.4 error frame data; fails on any other shape."""
    assert isinstance(obj, dict), f"{where}: error is not a JSON object: {obj!r}"
    code = obj.get("error", obj.get("code"))
    assert code in HTTP_STATUS, f"{where}: error code {code!r} is not in spec §2.4"
    assert code not in NEVER, f"{where}: {code}: {obj.get('message')!r}"
    assert isinstance(obj.get("message"), str), f"{where}: error without a message: {obj!r}"
    return str(code)


def check_http(status: int, content_type: str, body: bytes, where: str) -> Any:
    """Check one HTTP answer; returns its parsed JSON body (None for a non-JSON success)."""
    assert status != 500, f"{where}: 500 {body[:300]!r}"
    if status < 400:
        if content_type == "application/json":
            return orjson.loads(body)
        if content_type == "text/event-stream":
            check_sse_stream(body, where)
        return None
    assert "application/json" == content_type, (
        f"{where}: {status} error with content type {content_type!r}: {body[:200]!r}"
    )
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise AssertionError(f"{where}: {status} error body is not JSON: {body[:200]!r}") from exc
    code = error_code(obj, where)
    assert status == HTTP_STATUS[code] or (code, status) in EXTRA_STATUS, (
        f"{where}: {code} carried by HTTP {status}"
    )
    return obj


def check_close(code: int | None, where: str) -> None:
    """A WebSocket closed by the node must say why with an acceptable close code."""
    assert code in CLOSE_CODES_OK, f"{where}: closed with code {code}"


def check_sse_stream(body: bytes, where: str) -> None:
    """A whole bus SSE stream (spec §3.3, §2.4): events with one-line JSON data, errors
    from the closed set, and exactly one final ``done`` or ``error``."""
    events = []
    for block in body.split(b"\n\n"):
        fields = dict(
            line.split(b": ", 1)
            for line in block.split(b"\n")
            if b": " in line and line[:1] != b":"
        )
        if b"event" not in fields:
            continue
        event, data = fields[b"event"].decode(), orjson.loads(fields.get(b"data", b"null"))
        if event == "error":
            error_code(data, where)
        events.append(event)
    ends = [e for e in events if e in ("done", "error")]
    assert [events[-1]] == ends, f"{where}: a stream ends with one done or error: {events}"
