"""Values canonical JSON cannot represent, sent to a node process over real sockets: each is
``bad_request`` where it comes in, and the node goes on serving (spec §1.3, §2.5, §6.4)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import cbor2
import pytest

from hearthnet.identity import load_or_create_keys
from hearthnet.transport import headers as h
from hearthnet.transport.codec import SUBPROTOCOL_CBOR, SUBPROTOCOL_JSON
from tests.helpers import NodeProcess, run_cli, start_node_process
from tests.transport.test_bus_http import signed_call

# Over the CBOR subprotocol, as raw items: a tag-1 datetime, a UUID (tag 37), a half-float
# NaN, 2^64 - 1, and bytes inside data (bytes as the whole data are a binary payload).
CBOR_VALUES = {
    "datetime": bytes.fromhex("c11a5f000000"),
    "uuid": bytes.fromhex("d825") + cbor2.dumps(b"\x00" * 16),
    "nan": bytes.fromhex("f97e00"),
    "u64": bytes.fromhex("1bffffffffffffffff"),
    "bytes": cbor2.dumps([b"\x01\x02"]),
}


@pytest.fixture
def node_proc(tmp_path: Path) -> Iterator[NodeProcess]:
    """A node process on a free loopback port, started as the README does."""
    proc = start_node_process(tmp_path / "data")
    try:
        yield proc
    finally:
        proc.stop()


def issue_token(node_proc: NodeProcess, scope: str) -> str:
    """A token issued by the node's own key (``hearthnet token issue``)."""
    issued = run_cli(
        "token", "issue", "--scope", scope, "--ttl", "10m", "--data-dir", str(node_proc.data_dir)
    )
    assert 0 == issued.returncode, issued.stderr
    return issued.stdout.strip()


def cbor_publish(ref: str, data_item: bytes) -> bytes:
    """A pub/sub publish frame as a CBOR map whose ``data`` is the raw item given."""
    fields: list[tuple[str, Any]] = [
        ("type", "publish"),
        ("topic", "a.b"),
        ("msg_type", "t"),
        ("ref", ref),
    ]
    out = bytes([0xA0 + len(fields) + 1])
    for key, value in fields:
        out += cbor2.dumps(key) + cbor2.dumps(value)
    return out + cbor2.dumps("data") + data_item


async def replies(ws: aiohttp.ClientWebSocketResponse, count: int) -> dict[str, str]:
    """The next ``count`` publish replies, by ref: ``ok`` or the error code."""
    out: dict[str, str] = {}
    async with asyncio.timeout(10):
        while len(out) < count:
            msg = await ws.receive()
            assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), msg
            frame = cbor2.loads(msg.data) if msg.type == aiohttp.WSMsgType.BINARY else msg.json()
            if frame["event"] == "published.ok":
                out[frame["data"]["ref"]] = "ok"
            elif frame["event"] == "error":
                out[frame["data"].get("ref", "?")] = frame["data"]["code"]
    return out


async def test_http_publish_of_unrepresentable_data_is_bad_request_and_the_node_lives(
    node_proc: NodeProcess,
) -> None:
    """A pub:a.** token holder posting 2^53 + 1, 1e20, a 30-digit integer or JSON nested 300
    deep gets 400 bad_request for each; the next publish is stored and the process runs on."""
    token = issue_token(node_proc, "pub:a.**")
    url = node_proc.url + "/pubsub/v1/topics/a.b/messages"
    bodies = [
        b'{"type":"t","data":9007199254740993}',
        b'{"type":"t","data":1e20}',
        b'{"type":"t","data":100000000000000000000000000000}',
        b'{"type":"t","data":' + b"[" * 300 + b"]" * 300 + b"}",
    ]
    results: list[tuple[int, str]] = []
    async with aiohttp.ClientSession() as http:
        for body in bodies:
            async with http.post(
                url, data=body, headers={h.TOKEN: token, "Content-Type": "application/json"}
            ) as resp:
                results.append((resp.status, (await resp.json())["error"]))
        async with http.post(
            url, json={"type": "t", "data": 9007199254740992}, headers={h.TOKEN: token}
        ) as resp:
            good = (resp.status, (await resp.json())["seq"])
    assert ([(400, "bad_request")] * 4, (200, 1), None) == (
        results,
        good,
        node_proc.proc.poll(),
    )


async def test_cbor_ws_publish_of_tags_nan_and_big_integers_fails_that_publish_only(
    node_proc: NodeProcess,
) -> None:
    """Over the CBOR subprotocol a datetime, UUID, NaN, 2^64 - 1 or bytes inside data is an
    error frame with bad_request for that publish (its ref); the session and the node go on
    and the next publishes (one of them bytes as the whole data) are acknowledged."""
    token = issue_token(node_proc, "pub:a.**")
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            node_proc.url + "/pubsub/v1/subscribe", protocols=(SUBPROTOCOL_CBOR,)
        ) as ws,
    ):
        await ws.send_bytes(cbor2.dumps({"type": "auth", "token": token}))
        assert "auth.ok" == cbor2.loads((await ws.receive()).data)["event"]
        for ref, item in CBOR_VALUES.items():
            await ws.send_bytes(cbor_publish(ref, item))
        await ws.send_bytes(cbor_publish("fine", cbor2.dumps({"n": 2**53})))
        await ws.send_bytes(cbor_publish("binary", cbor2.dumps(b"\x01\x02")))
        got = await replies(ws, len(CBOR_VALUES) + 2)
    assert ({**dict.fromkeys(CBOR_VALUES, "bad_request"), "fine": "ok", "binary": "ok"}, None) == (
        got,
        node_proc.proc.poll(),
    )


async def test_json_ws_publish_of_a_big_integer_fails_that_publish_only(
    node_proc: NodeProcess,
) -> None:
    """Over the JSON subprotocol, 2^53 + 1 as data is bad_request for that publish (its
    ref); the next publish on the same session is acknowledged."""
    token = issue_token(node_proc, "pub:a.**")
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(
            node_proc.url + "/pubsub/v1/subscribe", protocols=(SUBPROTOCOL_JSON,)
        ) as ws,
    ):
        await ws.send_json({"type": "auth", "token": token})
        assert "auth.ok" == (await ws.receive()).json()["event"]
        await ws.send_str(
            '{"type":"publish","topic":"a.b","msg_type":"t","ref":"big","data":9007199254740993}'
        )
        await ws.send_json(
            {"type": "publish", "topic": "a.b", "msg_type": "t", "ref": "ok", "data": 1}
        )
        got = await replies(ws, 2)
    assert ({"big": "bad_request", "ok": "ok"}, None) == (got, node_proc.proc.poll())


async def test_bus_call_with_deep_nesting_or_a_30_digit_integer_is_bad_request(
    node_proc: NodeProcess,
) -> None:
    """POST /bus/v1/call: input nested 300 or 1,000 deep in a signed call, and a 30-digit
    integer from a call:echo token holder, are 400 bad_request (not 500, not a rounded
    float); the node still answers a good call."""
    keys = load_or_create_keys(node_proc.data_dir)
    community = node_proc.fields["community"]
    token = issue_token(node_proc, "call:echo")
    url = node_proc.url + "/bus/v1/call"
    deep_300: Any = []
    for _ in range(299):
        deep_300 = [deep_300]
    signed_300 = signed_call(keys, community, "echo", {"input": deep_300})
    deep_1000 = b'{"input":' + b"[" * 1000 + b"]" * 1000 + b"}"
    token_headers = {h.CAPABILITY: "echo", h.VERSION: "1.0", h.TOKEN: token}
    requests: list[tuple[dict[str, str], bytes]] = [
        (signed_300, b'{"input":' + b"[" * 300 + b"]" * 300 + b"}"),
        (signed_300, deep_1000),
        (token_headers, b'{"input": 100000000000000000000000000000}'),
    ]
    results: list[tuple[int, str]] = []
    async with aiohttp.ClientSession() as http:
        for headers, body in requests:
            async with http.post(url, data=body, headers=headers) as resp:
                answer = await resp.json(content_type=None)
                results.append((resp.status, answer.get("error", str(answer))))
        async with http.post(url, json={"input": 2**53}, headers=token_headers) as resp:
            good = (resp.status, (await resp.json())["output"])
    assert ([(400, "bad_request")] * 3, (200, {"echo": 2**53}), None) == (
        results,
        good,
        node_proc.proc.poll(),
    )
