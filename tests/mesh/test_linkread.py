"""A peer link reading in batches (spec §11) over real loopback WebSockets: frames arrive
whole and in order, control frames, the closing handshake and protocol errors behave as
with aiohttp's own reader, and links between nodes read this way over TLS too."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from hearthnet.clock import now_ms
from hearthnet.mesh.frames import Bye
from hearthnet.mesh.linkread import LinkReader, abort, install, reader_of
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.protocol import MAX_FRAME_BYTES, LinkState, PeerInfo, encode_frame
from hearthnet.mesh.route_header import TAG_BYTE
from hearthnet.mesh.wsbatch import encode_frames
from hearthnet.transport.rawwriter import raw_writer
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.conftest import ServeWs
from tests.mesh.test_tls import pair


class End:
    """What one end of a link was handed: frames, binary frames, and how it went down."""

    def __init__(self) -> None:
        self.got: list[bytes | str] = []  # binary frames as bytes, CBOR frames by kind
        self.down: list[str] = []
        self.link: PeerLink | None = None

    def make(self, ws: Any, outbound: bool) -> PeerLink:
        """A link on ``ws`` that records into this end."""
        self.link = PeerLink(
            PeerInfo(f"ed25519:{'b' if outbound else 'a'}", "peer", None, "0"),
            ws,
            outbound=outbound,
            on_frame=lambda link, frame: self.got.append(str(frame["t"])),
            on_down=lambda link, reason: self.down.append(reason),
            on_binary=lambda link, data: self.got.append(data),
        )
        return self.link


@pytest.fixture
async def server(serve_ws: ServeWs) -> tuple[TestServer, End]:
    """A WebSocket server that runs a batch-reading peer link on each connection."""
    end = End()

    async def session(ws: web.WebSocketResponse) -> None:
        install(ws, MAX_FRAME_BYTES)
        await end.make(ws, outbound=False).run()

    options = {"max_msg_size": MAX_FRAME_BYTES, "compress": False, "autoping": True}
    return await serve_ws(session, **options), end


def route(i: int) -> bytes:
    """A binary frame (the route tag and a body) numbered ``i``."""
    return TAG_BYTE + i.to_bytes(4, "big") * (1 + i % 50)


def reader_transport(ws: aiohttp.ClientWebSocketResponse) -> asyncio.Transport:
    """The transport a client WebSocket reads from (to stop reading, as a slow peer)."""
    transport: Any = getattr(getattr(ws, "_conn", None), "transport", None)
    assert transport is not None
    return transport  # type: ignore[no-any-return]


async def connect(
    http: aiohttp.ClientSession, server: TestServer, autoping: bool = True
) -> aiohttp.ClientWebSocketResponse:
    """A client WebSocket to the fixture's server (``autoping`` False: pongs are returned)."""
    return await http.ws_connect(
        server.make_url("/"), max_msg_size=MAX_FRAME_BYTES, autoping=autoping, compress=0
    )


async def test_frames_arrive_whole_and_in_order_both_ways(
    server: tuple[TestServer, End],
) -> None:
    """Binary and CBOR frames sent in batches reach both links in order, each once, read
    by the installed reader on both ends."""
    test_server, there = server
    here = End()
    sent = [route(i) if i % 5 else encode_frame("ping", seq=i, ts=0) for i in range(2000)]
    expected: list[bytes | str] = [d if d[:1] == TAG_BYTE else "ping" for d in sent]
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, test_server)
        ours = install(ws, MAX_FRAME_BYTES)
        link = here.make(ws, outbound=True)
        running = asyncio.get_running_loop().create_task(link.run())
        for data in sent:
            link.send_raw(data)
        await wait_until(lambda: len(there.got) >= len(sent), what="every frame there")
        assert there.link is not None
        for data in sent:
            there.link.send_raw(data)
        await wait_until(lambda: len(here.got) >= len(sent), what="every frame back")
        installed = (type(ours), type(reader_of(there.link.ws)))
        counted = there.link.frames_in
        link.close("done")
        await running
    assert ((LinkReader, LinkReader), expected, expected, 2000) == (
        installed,
        there.got,
        here.got,
        counted,
    )


async def test_bye_ends_the_link_and_what_follows_is_not_handled(
    server: tuple[TestServer, End],
) -> None:
    """A bye in the middle of one read takes the link down with its reason; the frames
    after it in that read are not handed on."""
    test_server, there = server
    frames = [route(1), route(2), Bye("closing", "moving").encode(), route(3)]
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, test_server)
        await ws.send_bytes(route(0))
        await wait_until(lambda: bool(there.got), what="the first frame")
        ws._writer.transport.write(encode_frames(frames, masked=True))  # one write
        closed = await ws.receive(timeout=10)
        await wait_until(lambda: bool(there.down), what="the link went down")
    assert (["peer said bye: moving"], 1000) == (there.down, closed.data)
    assert [route(0), route(1), route(2)] == there.got


async def test_frames_queued_while_the_socket_is_full_go_out_after_it_drains(
    server: tuple[TestServer, End],
) -> None:
    """A peer that stops reading fills the link's socket: what waits in the transport
    stays bounded (the callback that writes a loop turn's frames leaves a full socket
    to the write loop, which waits for the drain), and every frame queued meanwhile
    arrives once and in order when the peer reads again."""
    test_server, there = server
    sent = [route(i) + bytes(4096) for i in range(4000)]  # ~16 MB: more than loopback buffers
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, test_server)
        await ws.send_bytes(route(0))
        await wait_until(lambda: bool(there.got), what="the link up")
        assert there.link is not None
        transport = reader_transport(ws)
        transport.pause_reading()
        writer = raw_writer(there.link.ws)
        assert writer is not None
        buffered = 0
        for i, data in enumerate(sent):
            there.link.send_raw(data)
            if i % 64 == 63:
                await asyncio.sleep(0)  # a loop turn: what is queued goes out
                buffered = max(buffered, writer.transport.get_write_buffer_size())
        await wait_until(lambda: bool(writer.protocol._paused), what="the socket full")
        transport.resume_reading()
        got: list[bytes] = []
        while len(got) < len(sent):
            got.append((await ws.receive(timeout=10)).data)
    assert (True, sent) == (buffered < 2 * 1024 * 1024, got)


async def test_pings_are_answered_and_a_close_ends_the_link_at_once(
    server: tuple[TestServer, End],
) -> None:
    """aiohttp still answers a ping; the peer's close is answered and the link goes down
    as ``peer closed``, without waiting out a close timeout."""
    test_server, there = server
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, test_server, autoping=False)
        await ws.send_bytes(route(7))
        await ws.ping(b"are you there")
        pong = await ws.receive(timeout=10)
        started = asyncio.get_running_loop().time()
        await ws.close(code=1000)
        await wait_until(lambda: bool(there.down), what="the link went down")
        took = asyncio.get_running_loop().time() - started
    assert ((WSMsgType.PONG, b"are you there"), ["peer closed"], [route(7)], True) == (
        (pong.type, pong.data),
        there.down,
        there.got,
        took < 5.0,  # aiohttp's close timeout is 10 s
    )


async def test_an_aborted_link_goes_down_without_a_closing_handshake(serve_ws: ServeWs) -> None:
    """A link dropped with abort (a silent relay's) goes down at once and its peer sees
    the connection end with no close frame: nothing waits for an answer."""
    seen: list[WSMsgType | None] = []

    async def session(ws: web.WebSocketResponse) -> None:
        seen.append((await ws.receive()).type)  # the first frame
        try:
            seen.append((await ws.receive()).type)  # what ends it
        except asyncio.CancelledError:  # the server cancels its handler when the peer goes
            seen.append(None)
            raise

    options = {"max_msg_size": MAX_FRAME_BYTES, "compress": False, "autoping": True}
    test_server = await serve_ws(session, **options)
    here = End()
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, test_server)
        install(ws, MAX_FRAME_BYTES)
        link = here.make(ws, outbound=True)
        running = asyncio.get_running_loop().create_task(link.run())
        link.send_raw(route(1))
        await wait_until(lambda: len(seen) == 1, what="the first frame there")
        link.close("the relay went silent", send_bye=False)
        aborted = abort(ws)
        await running
        await wait_until(lambda: len(seen) == 2, what="the server's end of it")
    assert (True, ["the relay went silent"], [WSMsgType.BINARY]) == (
        aborted,
        here.down,
        seen[:1],
    )
    assert WSMsgType.CLOSE != seen[1]


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (struct.pack("!BBQ", 0x82, 127, MAX_FRAME_BYTES), 1009),  # the limit, header alone
        (bytes((0x92, 0)), 1002),  # a reserved bit
        (bytes((0x81, 2)) + b"\xff\xfe", 1007),  # text that is not UTF-8
    ],
)
async def test_protocol_errors_close_with_aiohttps_codes(
    server: tuple[TestServer, End], raw: bytes, code: int
) -> None:
    """A frame aiohttp refuses closes the connection with aiohttp's code (frames before
    it are handled) and takes the link down."""
    test_server, there = server
    async with aiohttp.ClientSession() as http:
        ws = await connect(http, test_server)
        await ws.send_bytes(route(1))
        await wait_until(lambda: bool(there.got), what="the first frame")
        ws._writer.transport.write(raw)
        closed = await ws.receive(timeout=10)
        await wait_until(lambda: bool(there.down), what="the link went down")
    assert ((WSMsgType.CLOSE, code), [route(1)]) == ((closed.type, closed.data), there.got)


async def test_links_between_nodes_read_in_batches_over_tls(make_config: MakeConfig) -> None:
    """Both ends of a TLS peer link between two nodes read through the batch reader, and
    frames sent after the handshake arrive."""
    async with pair(make_config, "on") as (a, b):
        b.mesh.book.add(a.url, node=a.keys.node_id)
        await wait_until(lambda: b.keys.node_id in a.mesh.links, what="a TLS link")
        ends = (a.mesh.links[b.keys.node_id], b.mesh.links[a.keys.node_id])
        before = ends[0].frames_in
        ends[1].send("ping", seq=1, ts=now_ms())
        await wait_until(lambda: ends[0].frames_in > before, what="a frame read")
        tls = ends[0].ws.get_extra_info("ssl_object") is not None  # type: ignore[attr-defined]
        assert ((LinkReader, LinkReader), True, LinkState.UP) == (
            (type(reader_of(ends[0].ws)), type(reader_of(ends[1].ws))),
            tls,
            ends[0].state,
        )
