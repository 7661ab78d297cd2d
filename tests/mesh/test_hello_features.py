"""The hello's ``features`` (spec §7.2 as built: ``hearthnet-peer.v5``): what the
sender's build does beyond what the link carries, ``call_resend`` among them; a peer on
an older link lists none. Pure: no sockets."""

from __future__ import annotations

import pytest

from hearthnet.errors import BadRequest, InvalidSignature
from hearthnet.mesh.protocol import FEATURES, Handshake, PeerInfo, decode_frame
from tests.mesh.test_protocol import NOW, A, B, community, run


def test_v5_hellos_list_call_resend_and_older_links_none() -> None:
    """On a v5 link each side learns the other's features from its hello; on v1-v4 links
    no hello carries the field (an older node refuses it) and the peer takes no
    openings again."""
    view = community(B)
    seen = []
    for link in (5, 4, 3, 1):
        dialer = Handshake(A, view, True, NOW, link=link, features=FEATURES)
        acceptor = Handshake(B, view, False, NOW, link=link, features=FEATURES)
        carried: list[bool] = []

        def watch(step: int, frame: dict[str, object], carried: list[bool] = carried) -> object:
            carried.append("features" in frame)
            return frame

        run(dialer, acceptor, watch)
        peers = (acceptor.peer, dialer.peer)
        seen.append((link, carried, [p.takes_call_resends if p else None for p in peers]))
    expected = [
        (5, [True] * 3, [True, True]),
        *((link, [False] * 3, [False, False]) for link in (4, 3, 1)),
    ]
    assert (("call_resend",), expected) == (FEATURES, seen)


def test_features_unknown_here_are_ignored_and_ours_missing_means_none() -> None:
    """A later build's feature is ignored (the link comes up); a v5 peer that lists no
    ``call_resend`` is not sent openings again; a relayed path's peer lists none."""
    view = community(B)
    later = Handshake(A, view, True, NOW, features=("call_resend", "later.feature"))
    acceptor = Handshake(B, view, False, NOW, features=FEATURES)
    run(later, acceptor)
    bare = Handshake(A, view, True, NOW, features=())
    acceptor2 = Handshake(B, view, False, NOW)
    run(bare, acceptor2)
    got = [p.features if p else None for p in (acceptor.peer, acceptor2.peer)]
    relayed = PeerInfo(A.node_id, "", None, "")
    assert ([frozenset({"call_resend"}), frozenset()], False) == (
        got,
        relayed.takes_call_resends,
    )


@pytest.mark.parametrize(
    "features",
    [
        "call_resend",  # not a list
        [7],  # not strings
        [""],  # empty
        ["f" * 65],  # too long
        [f"f{i}" for i in range(33)],  # more than 32
    ],
)
def test_v5_hello_features_out_of_shape_are_refused(features: object) -> None:
    """A v5 hello whose features is not a list of at most 32 names of 1 to 64 characters
    is bad_request, before its signature is checked."""
    view = community(B)
    hello = {**decode_frame(Handshake(A, view, True, NOW).start()), "features": features}
    with pytest.raises(BadRequest) as refused:
        Handshake(B, view, False, NOW).receive(hello, NOW)
    expected = "hello features is a list of at most 32 names of at most 64 characters"
    assert expected == refused.value.message


def test_hello_features_are_signed() -> None:
    """A hello whose features were dropped in flight fails its signature (a relay or a
    man in the middle cannot make a node look older, or newer)."""

    def strip(step: int, frame: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in frame.items() if k != "features"} if step == 2 else frame

    view = community(B)
    ours, theirs = (Handshake(k, view, k is A, NOW, features=FEATURES) for k in (A, B))
    with pytest.raises(InvalidSignature):
        run(ours, theirs, strip)
