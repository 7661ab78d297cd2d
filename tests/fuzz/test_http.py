"""Fuzzing the HTTP edges of a live node: bus calls, publish, history, subscribe query
strings, the other GET routes and raw request heads (spec §2.2, §2.4, §2.5, §6.4, §6.5).

Every answer must be a success or a JSON error from the closed set of spec §2.4, and
after every input the node must be alive, answer a signed echo@1.0 and hold nothing an
unauthorised sender tried to store.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import quote, urlencode

import orjson
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from hearthnet.ids import b64url_encode
from tests.fuzz.budget import budget
from tests.fuzz.live import TOKEN_PREFIX, LiveNode
from tests.fuzz.oracle import check_http
from tests.fuzz.strategies import (
    edge_ints,
    good_topics,
    header_names,
    header_values,
    json_text,
    json_values,
    nested,
    odd_text,
    publishable,
    query_values,
    representable,
    surrogate_text,
    topics,
)

# Values a signed body may carry and the node must echo exactly, and values it must
# refuse as bad_request at the edge (spec §2.5) before anything else happens.
hostile_values = st.one_of(
    json_values(),
    json_values(st.one_of(edge_ints, st.sampled_from([1e20, 2.0**60, float("nan")]))),
    st.sampled_from([float("nan"), float("inf"), -float("inf"), 10**30, 2**64 - 1]),
    surrogate_text,
)


def call(live: LiveNode, value: Any, *, extra: dict[str, Any] | None = None) -> tuple[int, Any]:
    """A call to echo@1.0 by the anchor with ``{"input": value}``, signed when JCS can
    sign it (otherwise signed over a stand-in, as a client with a broken encoder would)."""
    body = {"input": value, **(extra or {})}
    envelope = live.call_envelope(live.anchor, body)
    signable = representable(envelope)
    signature = live.anchor.sign_object(
        envelope if signable else live.call_envelope(live.anchor, {"input": None})
    )
    return live.run(
        live.request(
            "POST",
            "/bus/v1/call",
            data=json_text(body),
            headers=live.call_headers(envelope, signature),
        )
    )


@budget(250)
@given(value=hostile_values)
def test_signed_call_bodies(live: LiveNode, value: Any) -> None:
    """A signed echo@1.0 echoes what JCS can represent and refuses the rest as bad_request."""
    live.ensure_running()
    status, answer = call(live, value)
    live.check("http call body")
    if representable({"input": value}):
        assert (200, {"echo": value}) == (status, answer["output"])
    else:
        assert (400, "bad_request") == (status, answer["error"])


@budget(10)
@given(depth=st.integers(min_value=65, max_value=20_000))
def test_deep_call_bodies(live: LiveNode, depth: int) -> None:
    """A call body nested deeper than 64 is bad_request (spec §2.5)."""
    live.ensure_running()
    status, answer = call(live, nested(depth))
    live.check("http call nesting")
    assert (400, "bad_request") == (status, answer.get("error"))


@budget(20)
@given(field=odd_text.filter(lambda f: f not in ("input", "params")), value=json_values())
def test_unknown_call_body_fields(live: LiveNode, field: str, value: Any) -> None:
    """A call body field other than params and input is bad_request naming the field."""
    live.ensure_running()
    status, answer = call(live, 1, extra={field: value})
    live.check("http call body field")
    assert (400, "bad_request", True) == (
        status,
        answer["error"],
        field in answer["message"] or repr(field) in answer["message"],
    ), answer


@budget(160)
@given(
    mutations=st.lists(
        st.tuples(header_names, st.one_of(st.none(), header_values)), min_size=1, max_size=4
    ),
    body=st.one_of(st.binary(max_size=64), json_values().map(json_text)),
    signer=st.sampled_from(["anchor", "member", "stranger"]),
)
def test_call_headers(
    live: LiveNode, mutations: list[tuple[str, str | None]], body: bytes, signer: str
) -> None:
    """Signed call headers with some removed or replaced and any body: a JSON answer."""
    live.ensure_running()
    keys = {"anchor": live.anchor, "member": live.member, "stranger": live.stranger}[signer]
    envelope = live.call_envelope(keys, {"input": 1})
    headers = live.call_headers(envelope, keys.sign_object(envelope))
    for name, value in mutations:
        if value is None:
            headers.pop(name, None)
        else:
            headers[name] = value
    live.run(live.request("POST", "/bus/v1/call", data=body, headers=headers))
    live.check("http call headers")


def publish_path(topic: str) -> str:
    """The publish route for ``topic``, percent-encoded."""
    return f"/pubsub/v1/topics/{quote(topic, safe='')}/messages"


@budget(250)
@given(
    sender=st.sampled_from(["member", "token", "stranger", "none"]),
    topic=st.one_of(topics, good_topics.map(lambda t: f"{TOKEN_PREFIX}.{t}")),
    body=st.fixed_dictionaries(
        {"data": hostile_values},
        optional={
            "type": st.one_of(odd_text, st.sampled_from(["m", "token", ""]), json_values()),
            "ttl_s": st.one_of(st.integers(), json_values()),
        },
    ),
)
def test_publish(live: LiveNode, sender: str, topic: str, body: dict[str, Any]) -> None:
    """HTTP publish: strangers store nothing; data JCS cannot sign is bad_request."""
    live.ensure_running()
    path = publish_path(topic)
    raw = json_text(body)
    headers = {"Content-Type": "application/json"}
    if sender == "token":
        headers["X-HearthNet-Token"] = live.token
        if topic.startswith(TOKEN_PREFIX + "."):
            live.allowed_topics.add(topic)
    elif sender in ("member", "stranger"):
        keys = live.member if sender == "member" else live.stranger
        signable = representable(body)
        headers.update(live.signed_headers(keys, "POST", path, body if signable else None))
        if sender == "member":
            live.allowed_topics.add(topic)
    status, answer = live.run(live.request("POST", path, data=raw, headers=headers))
    live.check("http publish")
    if sender in ("stranger", "none"):
        assert status >= 400, (status, answer)
    elif publishable(topic) and not representable(body["data"]):
        # spec §2.5: refused at the edge
        assert (400, "bad_request") == (status, answer["error"])


unsignable_values = st.one_of(
    st.sampled_from([2**64 - 1, 2**53 + 1, -(2**63) - 1, 10**30, 1e20, 2.0**60]),
    json_values(st.sampled_from([2**64 - 1, 10**30, 1e20])).filter(lambda v: not representable(v)),
)


@budget(30)
@given(
    sender=st.sampled_from(["token", "member"]),
    topic=good_topics.map(lambda t: f"{TOKEN_PREFIX}.{t}"),
    data=unsignable_values,
)
def test_publish_unsignable_data(live: LiveNode, sender: str, topic: str, data: Any) -> None:
    """Publish data JCS cannot represent is bad_request at the edge (spec §2.5), from a
    sender that may publish there; nothing is stored and the node lives."""
    live.ensure_running()
    path = publish_path(topic)
    body = {"type": "m", "data": data}
    headers = {"Content-Type": "application/json"}
    if sender == "token":
        headers["X-HearthNet-Token"] = live.token
    else:
        # The member signs what it can: the envelope with the data as it will be parsed.
        headers.update(live.signed_headers(live.member, "POST", path, None))
    status, answer = live.run(live.request("POST", path, data=json_text(body), headers=headers))
    live.check("http publish unsignable")
    assert (400, "bad_request") == (status, answer["error"])


history_params = st.dictionaries(
    st.sampled_from(["since_seq", "since_ts", "before_seq", "limit", "x", "token"]),
    query_values,
    max_size=4,
)
subscribe_params = st.dictionaries(
    st.sampled_from(["topics", "since_seq", "timeout_s", "last", "token", "x"]),
    st.one_of(query_values, st.lists(st.one_of(topics, st.just("**")), max_size=3).map(",".join)),
    max_size=4,
)


def _no_wait(params: dict[str, str]) -> dict[str, str]:
    """Keep long-polls short: a timeout that would make the node wait becomes 0."""
    raw = params.get("timeout_s")
    if raw is not None and raw.strip().isdigit():
        params["timeout_s"] = "0"
    return params


@budget(160)
@given(
    route=st.sampled_from(["history", "presence", "subscribe", "sse", "topics"]),
    topic=topics,
    hparams=history_params,
    sparams=subscribe_params,
    sender=st.sampled_from(["member", "token", "query-token", "stranger", "none"]),
    last_event_id=st.one_of(st.none(), header_values),
)
def test_query_strings(
    live: LiveNode,
    route: str,
    topic: str,
    hparams: dict[str, str],
    sparams: dict[str, str],
    sender: str,
    last_event_id: str | None,
) -> None:
    """History, presence, topics, long-poll and SSE with hostile query strings."""
    live.ensure_running()
    base = {
        "history": f"/pubsub/v1/topics/{quote(topic, safe='')}/history",
        "presence": f"/pubsub/v1/topics/{quote(topic, safe='')}/presence",
        "subscribe": "/pubsub/v1/subscribe",
        "sse": "/pubsub/v1/subscribe",
        "topics": "/pubsub/v1/topics",
    }[route]
    params = hparams if route in ("history", "presence", "topics") else _no_wait(sparams)
    if sender == "query-token":
        params = {**params, "token": live.token}
    path = base + ("?" + urlencode(params, safe="*,") if params else "")
    headers: dict[str, str] = {}
    if route == "sse":
        headers["Accept"] = "text/event-stream"
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    if sender == "token":
        headers["X-HearthNet-Token"] = live.token
    elif sender in ("member", "stranger"):
        keys = live.member if sender == "member" else live.stranger
        headers.update(live.signed_headers(keys, "GET", path, None))
    live.run(_get_first(live, path, headers))
    live.check(f"http {route} query")


async def _get_first(live: LiveNode, path: str, headers: dict[str, str]) -> None:
    """GET ``path``; an SSE stream is checked on its head and first bytes, then closed."""
    async with asyncio.timeout(10):
        async with live.session.get(URL(live.url + path, encoded=True), headers=headers) as resp:
            if resp.content_type == "text/event-stream" and resp.status == 200:
                first = await resp.content.readline()
                assert first.startswith((b"event:", b":", b"id:", b"retry:")), first
                return
            check_http(resp.status, resp.content_type, await resp.read(), f"GET {path}")


@budget(120)
@given(
    route=st.sampled_from(
        [
            "/manifest",
            "/health",
            "/ready",
            "/metrics",
            "/status",
            "/",
            "/bus/v1/capabilities",
            "/mesh/v1/peers",
            "/bus/v1/call",
            "/mesh/v1/peer",
            "/mesh/v1/membership",
            "/nothing/here",
        ]
    ),
    suffix=st.one_of(st.just(""), st.text(max_size=20).map(lambda s: quote(s, safe="/?&=%"))),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]),
    body=st.one_of(st.none(), st.binary(max_size=32)),
)
def test_other_routes(
    live: LiveNode, route: str, suffix: str, method: str, body: bytes | None
) -> None:
    """Any method on any route, with junk appended: a success or a JSON error."""
    live.ensure_running()
    live.run(live.request(method, route + suffix, data=body))
    live.check("http other routes")


# --- raw request heads ---------------------------------------------------------------

header_line_bytes = st.one_of(
    st.builds(
        lambda name, value: name + b": " + value,
        st.sampled_from(
            [b"X-HearthNet-Timestamp", b"Content-Length", b"Transfer-Encoding", b"Host", b"X"]
        ),
        st.one_of(st.binary(max_size=24).map(lambda b: b.replace(b"\r\n", b"")), st.just(b"")),
    ),
    st.binary(min_size=1, max_size=40).filter(lambda b: b"\r\n" not in b),
    st.sampled_from(
        [b" folded", b"\tfolded", b":", b"NoColon", b"Content-Length: -1", b"Content-Length: 1e3"]
    ),
)
request_lines = st.one_of(
    st.sampled_from(
        [
            b"POST /bus/v1/call HTTP/1.1",
            b"GET /manifest HTTP/1.1",
            b"GET /pubsub/v1/subscribe?topics=a HTTP/1.1",
            b"GET / HTTP/1.0",
            b"GET /manifest HTTP/2.0",
            b"BREW /manifest HTTP/1.1",
            b"GET manifest HTTP/1.1",
            b"GET /%ff%fe HTTP/1.1",
            b"GET /" + b"a" * 9000 + b" HTTP/1.1",
        ]
    ),
    st.binary(min_size=1, max_size=40).filter(lambda b: b"\r\n" not in b),
)


async def raw_exchange(live: LiveNode, head: bytes, body: bytes) -> tuple[int, bytes, bytes]:
    """Send one raw request, read the whole answer (the node closes or answers within the
    deadline); (status, content type, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", live.port)
    try:
        writer.write(head + body)
        await writer.drain()
        async with asyncio.timeout(10):
            status_line = await reader.readline()
            if not status_line:
                return 0, b"", b""  # closed without an answer: allowed for garbage
            headers: dict[bytes, bytes] = {}
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get(b"content-length", b"0") or 0)
            answer = await reader.readexactly(length) if length else b""
        return int(status_line.split()[1]), headers.get(b"content-type", b""), answer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


@budget(120)
@given(
    line=request_lines,
    lines=st.lists(header_line_bytes, max_size=8),
    many=st.sampled_from([0, 0, 0, 120, 1000]),
    big=st.sampled_from([0, 0, 0, 17 * 1024]),
    body=st.binary(max_size=32),
)
def test_raw_request_heads(
    live: LiveNode, line: bytes, lines: list[bytes], many: int, big: int, body: bytes
) -> None:
    """Malformed request heads, many headers, oversized headers: a JSON error, not text."""
    live.ensure_running()
    filler = [b"X-Fill-%d: 1" % i for i in range(many)]
    if big:
        filler.append(b"X-Big: " + b"b" * big)
    head = b"\r\n".join([line, b"Host: 127.0.0.1", *lines, *filler, b"Connection: close"])
    status, content_type, answer = live.run(raw_exchange(live, head + b"\r\n\r\n", body))
    live.check("http raw heads")
    if status:
        ctype = content_type.split(b";")[0].decode("latin-1")
        check_http(status, ctype, answer, f"raw {line[:40]!r}")


# --- size limits (spec §2.5) -----------------------------------------------------------

KIB = 1024


@budget(12)
@given(
    edge=st.sampled_from(["call", "publish"]),
    delta=st.sampled_from([-4 * KIB, -64, 64, 4 * KIB, 3 * 1024 * KIB]),
)
def test_size_limits(live: LiveNode, edge: str, delta: int) -> None:
    """Just under a limit is served; just over it is payload_too_large (413)."""
    live.ensure_running()
    if edge == "call":
        # The request body limit is 1 MiB; the string fills the body to limit + delta.
        limit = 1024 * KIB
        overhead = len(orjson.dumps({"input": ""}))
        value = "x" * (limit + delta - overhead)
        status, answer = call(live, value)
    else:
        # The payload limit is 256 KiB of data, whatever the body around it.
        limit = 256 * KIB
        value = "x" * (limit + delta - 2)  # the JSON string's two quotes count
        body = {"type": "m", "data": value}
        path = publish_path("fuzz.size")
        live.allowed_topics.add("fuzz.size")
        headers = {"Content-Type": "application/json"}
        headers.update(live.signed_headers(live.member, "POST", path, body))
        status, answer = live.run(
            live.request("POST", path, data=orjson.dumps(body), headers=headers)
        )
    live.check(f"http size {edge}")
    expected = (200, None) if delta < 0 else (413, "payload_too_large")
    assert expected == (status, answer.get("error")), answer


# --- forged tokens (spec §1.6) -----------------------------------------------------------

token_payloads = st.one_of(
    json_values().map(json_text),
    st.fixed_dictionaries(
        {
            "iss": st.one_of(odd_text, st.just("ed25519:" + "A" * 43)),
            "sub": st.one_of(odd_text, json_values()),
            "community": odd_text,
            "scopes": st.one_of(
                st.lists(st.dictionaries(st.sampled_from(["pub", "sub", "call"]), odd_text)),
                json_values(),
            ),
            "exp_ms": st.one_of(edge_ints, json_values()),
            "jti": odd_text,
            "sig": odd_text,
        }
    ).map(json_text),
    st.integers(min_value=1, max_value=3000).map(lambda d: b"[" * d + b"]" * d),
    st.binary(max_size=64),
)


@budget(120)
@given(
    payload=token_payloads,
    route=st.sampled_from(["call", "history", "subscribe", "publish"]),
)
def test_forged_tokens(live: LiveNode, payload: bytes, route: str) -> None:
    """A forged or malformed token is refused with invalid_signature on every route."""
    live.ensure_running()
    token = "hnt1:" + b64url_encode(payload)
    headers = {"X-HearthNet-Token": token, "Content-Type": "application/json"}
    if route == "call":
        headers.update({"X-HearthNet-Capability": "echo", "X-HearthNet-Capability-Version": "1.0"})
        method, path, body = "POST", "/bus/v1/call", b'{"input": 1}'
    elif route == "publish":
        method, path, body = "POST", publish_path("fuzz.forged"), b'{"type":"m","data":1}'
    elif route == "history":
        method, path, body = "GET", "/pubsub/v1/topics/fuzz.forged/history", None
    else:
        headers.pop("X-HearthNet-Token")
        query = urlencode({"topics": "fuzz.forged", "timeout_s": "0", "token": token})
        method, path, body = "GET", "/pubsub/v1/subscribe?" + query, None
    status, answer = live.run(live.request(method, path, data=body, headers=headers))
    live.check("http forged token")
    assert status in (401, 413), answer  # invalid_signature; an over-long one may be 413


@budget(60)
@given(
    cap=st.sampled_from(["echo.stream", "echo"]),
    value=st.one_of(
        st.fixed_dictionaries(
            {"count": st.integers(-1, 4)},
            optional={"size": st.integers(-1, 70_000), "interval_ms": st.integers(-1, 2)},
        ),
        json_values(),
    ),
)
def test_sse_calls(live: LiveNode, cap: str, value: Any) -> None:
    """Calls answered as SSE streams: well-formed events, one final done or error."""
    live.ensure_running()
    body = {"input": value}
    envelope = live.call_envelope(live.member, body, cap=cap)
    signature = live.member.sign_object(envelope) if representable(envelope) else "ed25519:AA"
    headers = {**live.call_headers(envelope, signature), "Accept": "text/event-stream"}
    live.run(live.request("POST", "/bus/v1/call", data=json_text(body), headers=headers))
    live.check("http sse call")


@budget(40)
@given(
    encoding=st.sampled_from(["gzip", "deflate", "br", "identity", "zzz", "gzip, gzip", ""]),
    path=st.sampled_from(
        ["/bus/v1/call", "/mesh/v1/membership", "/mesh/v1/join", publish_path("fuzz.enc")]
    ),
    body=st.binary(max_size=64),
)
def test_content_encodings(live: LiveNode, encoding: str, path: str, body: bytes) -> None:
    """Bodies that are not what their Content-Encoding says: a JSON error, never a 500."""
    live.ensure_running()
    headers = {"Content-Encoding": encoding, "Content-Type": "application/json"}
    headers["X-HearthNet-Token"] = live.token
    headers.update({"X-HearthNet-Capability": "echo", "X-HearthNet-Capability-Version": "1.0"})
    live.allowed_topics.add("fuzz.enc")
    live.run(live.request("POST", path, data=body, headers=headers))
    live.check("http content encoding")
