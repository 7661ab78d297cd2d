"""Values canonical JSON cannot represent at the other edges of an in-process node, over real
loopback sockets: bus WebSocket call frames (JSON and CBOR) and membership records posted
over HTTP are bad_request (spec §2.5)."""

from __future__ import annotations

import json

import aiohttp
import cbor2

from hearthnet.ids import b64url_encode
from hearthnet.node import Node
from hearthnet.transport import headers as h
from tests.transport.test_bus_ws import call_frame, connect, read_all


async def test_bus_ws_call_frames_with_unrepresentable_input_are_bad_request(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A call frame whose input is 2^53 + 1 (JSON) or a UUID (CBOR tag 37) ends with one
    error frame, bad_request, on either subprotocol."""
    frame = call_frame(node.keys, node.membership.community_id, "echo", "placeholder")
    json_ws = await connect(http, node)
    await json_ws.send_str(json.dumps(frame).replace('"placeholder"', "9007199254740993"))
    json_frames = await read_all(json_ws)
    cbor_ws = await connect(http, node, "hearthnet-bus.v2+cbor")
    tag_37 = bytes.fromhex("d82550") + b"\x00" * 16
    await cbor_ws.send_bytes(cbor2.dumps(frame).replace(cbor2.dumps("placeholder"), tag_37))
    cbor_frames = await read_all(cbor_ws)
    assert (["error"], "bad_request", ["error"], "bad_request") == (
        [f["event"] for f in json_frames],
        json_frames[0]["data"]["code"],
        [f["event"] for f in cbor_frames],
        cbor_frames[0]["data"]["code"],
    )


async def test_membership_records_nested_too_deep_are_bad_request(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """POST /mesh/v1/membership with a record nested 1,000 deep or holding 2^53 + 1 is
    400 bad_request (not 500); the node still answers a well-formed empty post."""
    bodies = [
        b'{"records":[{"kind":' + b"[" * 1000 + b"]" * 1000 + b"}]}",
        b'{"records":[{"kind":"member","ts":9007199254740993}]}',
        b'{"records":[]}',
    ]
    results = []
    for body in bodies:
        async with http.post(node.url + "/mesh/v1/membership", data=body) as resp:
            answer = await resp.json()
            results.append((resp.status, answer.get("error", answer.get("applied"))))
    assert [(400, "bad_request"), (400, "bad_request"), (200, 0)] == results


async def test_a_token_nested_too_deep_is_refused_not_a_crash(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A token header whose JSON is nested 1,000 deep is 401 invalid_signature (a malformed
    token), on a publish and on a call, instead of a 500 from the JSON parser's recursion."""
    token = "hnt1:" + b64url_encode(b"[" * 1000 + b"]" * 1000)
    results = []
    for path, headers, body in (
        ("/pubsub/v1/topics/a.b/messages", {h.TOKEN: token}, {"type": "t", "data": 1}),
        ("/bus/v1/call", {h.TOKEN: token, h.CAPABILITY: "echo", h.VERSION: "1.0"}, {"input": 1}),
    ):
        async with http.post(node.url + path, json=body, headers=headers) as resp:
            results.append((resp.status, (await resp.json())["error"]))
    assert [(401, "invalid_signature")] * 2 == results
