"""Parsing pub/sub client frames (spec §6.5). Pure."""

from __future__ import annotations

import pytest

from hearthnet.errors import BadRequest
from hearthnet.pubsub.frames import (
    AckUpto,
    Auth,
    Ping,
    Publish,
    Since,
    Subscribe,
    parse_client_frame,
)


def test_frames_parse() -> None:
    """Each frame type becomes its value."""
    sub = parse_client_frame(
        {
            "type": "subscribe",
            "topics": ["chat.*"],
            "since": {"epoch": "e", "seq": 4},
            "consumer": "c1",
            "presence": {"name": "ann"},
        }
    )
    assert isinstance(sub, Subscribe)
    assert (["chat.*"], Since(epoch="e", seq=4), "c1", {"name": "ann"}) == (
        [p.text for p in sub.patterns],
        sub.since,
        sub.consumer,
        sub.presence,
    )
    assert [
        AckUpto(9),
        Ping(),
        Publish("a.b", "token", {"t": 1}, 60, "r1"),
        Auth({"token": "t"}, 64),
    ] == [
        parse_client_frame({"type": "ack", "upto": 9}),
        parse_client_frame({"type": "ping"}),
        parse_client_frame(
            {
                "type": "publish",
                "topic": "a.b",
                "msg_type": "token",
                "data": {"t": 1},
                "ttl_s": 60,
                "ref": "r1",
            }
        ),
        parse_client_frame({"type": "auth", "token": "t", "window": 64}),
    ]


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "dance"},
        {},
        {"type": "ack"},
        {"type": "ack", "upto": -1},
        {"type": "subscribe", "topics": []},
        {"type": "subscribe", "topics": ["a..b"]},
        {"type": "subscribe", "topics": ["a"], "since": {"seq": "1"}},
        {"type": "subscribe", "topics": ["a"], "since": {"when": 1}},
        {"type": "publish", "topic": "a.*", "msg_type": "x", "data": 1},
        {"type": "publish", "topic": "a", "msg_type": "bad type", "data": 1},
        {"type": "publish", "topic": "a", "msg_type": "x"},
        {"type": "publish", "topic": "a", "msg_type": "x", "data": 1, "ttl_s": 0},
        {"type": "auth", "window": 0},
        {"type": "auth", "window": 70000},
    ],
)
def test_bad_frames(frame: dict[str, object]) -> None:
    """Malformed frames are bad_request (the session answers error and goes on)."""
    with pytest.raises(BadRequest):
        parse_client_frame(frame)
