"""Pre-authentication bounds (spec §2.5): the pure table and head screening, fake clock."""

from __future__ import annotations

import pytest

from hearthnet.errors import BadRequest, HeadersTooLarge
from hearthnet.transport.preauth import (
    CHUNKED,
    ChunkedBodyEnd,
    PreAuthLimits,
    PreAuthTable,
    Refusal,
    ScreenedHead,
    descriptor_budget,
    screen_head,
)


def table(**limits: float) -> PreAuthTable:
    """A table with these limits (others at their defaults)."""
    return PreAuthTable(PreAuthLimits(**limits))  # type: ignore[arg-type]


def test_head_deadline_counts_from_the_accept() -> None:
    """A connection without a complete head is late exactly head_timeout_s after its accept."""
    t = table(head_timeout_s=10.0)
    t.open(1, "a", now=0.0)
    t.open(2, "a", now=5.0)
    before = t.sweep(9.99)
    at = t.sweep(10.0)
    assert ([], [(1, Refusal.HEAD_TIMEOUT)], 1) == (before, at, t.pending_count)


def test_body_pace_after_the_grace() -> None:
    """A body slower than the minimum average pace is late once the grace has passed."""
    t = table(body_grace_s=10.0, body_min_bytes_per_s=1024)
    for key in (1, 2):
        t.open(key, "a", now=0.0)
        t.body(key, now=1.0)
    t.received(1, 10 * 1024)  # keeps the pace
    t.received(2, 100)  # trickles
    in_grace = t.sweep(10.9)
    after = t.sweep(11.0)
    assert ([], [(2, Refusal.BODY_RATE)]) == (in_grace, after)


def test_excused_body_starts_anew() -> None:
    """A body held back by the server (reading paused) restarts its pace clock."""
    t = table(body_grace_s=1.0, head_timeout_s=100.0)
    t.open(1, "a", now=0.0)
    t.body(1, now=0.0)
    t.excuse(1, now=5.0)
    assert [] == t.sweep(5.5)


def test_admitted_connections_have_no_deadline() -> None:
    """A connection whose first request is complete is not pending any more."""
    t = table(head_timeout_s=1.0)
    t.open(1, "a", now=0.0)
    t.admit(1)
    assert ([], 0, 1) == (t.sweep(100.0), t.pending_count, t.open_count)


def test_per_source_cap_refuses_the_next_one_only_from_that_source() -> None:
    """Past per_source pending connections from one address the next is refused, others not."""
    t = table(per_source=2)
    results = [t.open(k, "a", 0.0) for k in (1, 2, 3)]
    other = t.open(4, "b", 0.0)
    t.admit(1)
    again = t.open(5, "a", 0.0)
    assert ([[], [], [(3, Refusal.PER_SOURCE)]], [], [], 2) == (
        results,
        other,
        again,
        t.pending_from("a"),
    )


def test_reserve_sheds_the_oldest_pending() -> None:
    """Pending connections never take the reserve: a new one sheds the oldest pending."""
    t = table(capacity=5, reserve=2)
    for key in (1, 2, 3):
        assert [] == t.open(key, f"s{key}", 0.0)
    shed = t.open(4, "s4", 1.0)
    assert ([(1, Refusal.FD_RESERVE)], 3, 3) == (shed, t.pending_count, t.open_count)


def test_full_capacity_sheds_pending_not_admitted() -> None:
    """At capacity admitted connections stay; the newest is refused if it alone is pending."""
    t = table(capacity=3, reserve=1)
    for key in (1, 2, 3):
        t.open(key, "a", 0.0)
        t.admit(key)
    assert ([(4, Refusal.FD_RESERVE)], 3) == (t.open(4, "a", 1.0), t.open_count)


def test_shed_oldest_and_closed() -> None:
    """shed_oldest forgets the oldest pending; closing forgets any connection once."""
    t = table()
    t.open(1, "a", 0.0)
    t.open(2, "a", 0.0)
    first = t.shed_oldest()
    t.closed(1)  # its connection_lost arrives later: no effect
    t.closed(2)
    assert (1, None, 0, 0) == (first, t.shed_oldest(), t.open_count, t.pending_from("a"))


def test_descriptor_budget() -> None:
    """Capacity is RLIMIT_NOFILE less used descriptors and the spare; reserve a tenth, <= half."""
    assert ((358, 40), (358, 100), (8, 4)) == (
        descriptor_budget(400, 41, 0),
        descriptor_budget(400, 41, 100),
        descriptor_budget(20, 11, 0),
    )


def test_tick_is_a_quarter_of_the_shortest_deadline() -> None:
    """Deadlines are checked often enough to close within a quarter of their length."""
    assert (1.0, 0.25) == (PreAuthLimits().tick_s, PreAuthLimits(head_timeout_s=1.0).tick_s)


def test_screen_head_body_framing() -> None:
    """Body framing and a missing HTTP/1.1 Host are found; the path loses its query."""
    plain = screen_head(b"GET /health?x=1 HTTP/1.1\r\nHost: a", 128, 16384)
    sized = screen_head(b"POST /bus/v1/call HTTP/1.1\r\nContent-Length: 12", 128, 16384)
    chunked = screen_head(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked", 128, 16384)
    assert (
        ScreenedHead(b"GET", "/health", 0, host=True),
        ScreenedHead(b"POST", "/bus/v1/call", 12, host=False),
        ScreenedHead(b"POST", "/", CHUNKED, host=True),
    ) == (plain, sized, chunked)


@pytest.mark.parametrize(
    "head",
    [b"GET /", b"GET / HTTP/2.0", b"G\x00T / HTTP/1.1", b"GET  HTTP/1.1", b"\x16\x03\x01"],
)
def test_screen_head_refuses_malformed_request_lines(head: bytes) -> None:
    """A request line that is not METHOD TARGET HTTP/1.x is bad_request."""
    with pytest.raises(BadRequest) as caught:
        screen_head(head, 128, 16384)
    assert ("bad_request", 400) == (caught.value.code, caught.value.http_status)


def test_screen_head_refuses_too_many_or_too_large_headers() -> None:
    """Too many header lines, or too many header bytes, is 431 payload_too_large."""
    many = b"GET / HTTP/1.1" + b"".join(b"\r\nX-%d: 1" % i for i in range(129))
    large = b"GET / HTTP/1.1\r\nX-Pad: " + b"p" * 16384
    codes = []
    for head in (many, large):
        with pytest.raises(HeadersTooLarge) as caught:
            screen_head(head, 128, 16384)
        codes.append((caught.value.code, caught.value.http_status))
    assert [("payload_too_large", 431)] * 2 == codes


def _fed(pieces: list[bytes]) -> list[bool]:
    end = ChunkedBodyEnd()
    return [end.feed(piece) for piece in pieces]


def test_a_chunk_whose_data_looks_like_the_last_chunk_does_not_end_the_body() -> None:
    """`3\\r\\n0\\r\\n\\r\\n` is a chunk of data "0\\r\\n": the body goes on until the real
    last chunk."""
    assert [False, True] == _fed([b"3\r\n0\r\n\r\n", b"0\r\n\r\n"])


def test_a_last_chunk_with_extensions_or_trailers_ends_the_body() -> None:
    """Extensions on any size line and trailer fields after the last chunk are framing."""
    assert [True, True] == [
        ChunkedBodyEnd().feed(b"5;name=v\r\nhello\r\n0;x=1\r\n\r\n"),
        ChunkedBodyEnd().feed(b"2\r\nhi\r\n0\r\nX-Check: y\r\n\r\n"),
    ]


def test_a_chunked_body_fed_a_byte_at_a_time_ends_at_its_last_byte() -> None:
    """Split anywhere, the end is found exactly at the final CRLF."""
    body = b"a\r\n0123456789\r\n1\r\nx\r\n0\r\n\r\n"
    results = _fed([body[i : i + 1] for i in range(len(body))])
    assert ([False] * (len(body) - 1) + [True]) == results


def test_malformed_chunk_framing_ends_the_watch() -> None:
    """A bad size line, missing CRLF after data, or an endless line: the HTTP server
    refuses such a body itself, so the front door stops waiting for its end."""
    assert [True, True, True] == [
        ChunkedBodyEnd().feed(b"zz\r\n"),
        ChunkedBodyEnd().feed(b"1\r\nxY\r\n"),
        ChunkedBodyEnd().feed(b"1" * 5000),
    ]
