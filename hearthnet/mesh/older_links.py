"""What a peer on a link older than ``hearthnet-peer.v3`` is not sent, and how its
anti-entropy is told so that it does not ask for it again and again (spec §6.2, §7.3). Pure.

A message with ``data_enc`` (a binary payload) is refused by a node built before binary
payloads, so it goes only on v3 links (:attr:`~hearthnet.mesh.protocol.PeerInfo.takes_binary`).
To a peer on an older link such a message is a hole in its origin's sequence, and its
anti-entropy (as built then) asks for the hole from its head up every round. The answer
tells it the hole is not to be had, in the terms that build understands:

- a run of such messages right above the peer's head (the ``from`` of its ``iwant``)
  with a message after it that we hold: an ``ihave`` for that origin whose floor is the
  message after the run. A node takes a floor above its head as "retention removed
  everything below" and moves its head past the run (``OriginTracker.skip_to``);
- a run that reaches our head: from then on our ``ihave`` shows that peer the head before
  the run, until a message it takes follows the run here (then the first case applies).

One round per run, then nothing more is asked for it. The messages themselves never
reach that peer over an older link. Once it is upgraded it computes its heads from its
log again at start (the hole shows again) and asks for them over its v3 links:
docs/protocol.md, "Versions".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import orjson

from hearthnet.mesh.frames import IHave, Msg

MAX_SHOWN_ORIGINS = 4_096  # origins per older peer shown a lower head, at most


def is_binary(raw: bytes) -> bool:
    """Whether the envelope ``raw`` carries a binary payload (a top-level ``data_enc``)."""
    obj = orjson.loads(raw)
    return isinstance(obj, dict) and "data_enc" in obj


def older_repair(rows: Sequence[bytes], first: int) -> tuple[list[bytes], int]:
    """The ``msg`` frames answering an older peer's ``iwant`` from ``first`` with ``rows``
    (raw envelopes of one origin from the log, ``origin_seq`` order), without the messages
    with ``data_enc``; and how many of those withheld come first, from ``first`` on with
    no gap (the run to tell the peer about)."""
    frames: list[bytes] = []
    leading = 0
    expect: int | None = first
    for raw in rows:
        obj = orjson.loads(raw)
        if "data_enc" in obj:
            if expect is not None and obj.get("origin_seq") == expect:
                leading += 1
                expect += 1
            continue
        expect = None
        frames.append(Msg(raw, 1).encode())
    return frames, leading


class Withheld:
    """Per peer on an older link, the origins whose newest messages it cannot take: our
    ``ihave`` shows it the head before them (see the module's docstring)."""

    def __init__(self) -> None:
        self.shown: dict[str, dict[str, int]] = {}  # node -> origin -> head shown

    def repaired(self, node: str, origin: str, first: int, leading: int, head: int) -> IHave | None:
        """``leading`` messages with ``data_enc`` from ``first`` on were withheld from
        ``node``, and we hold ``origin`` up to ``head``: the ``ihave`` that moves the peer
        past them, or None (none withheld, or the run reaches ``head``: the peer is shown
        ``first - 1`` from now on)."""
        if leading <= 0:
            return None
        after = first + leading
        if after <= head:
            return IHave({origin: head}, {origin: after})
        shown = self.shown.setdefault(node, {})
        if origin in shown or len(shown) < MAX_SHOWN_ORIGINS:
            shown[origin] = first - 1
        return None

    def ihave(self, node: str, ihave: IHave) -> IHave:
        """Our ``ihave`` as ``node`` is to see it."""
        shown = self.shown.get(node)
        if not shown:
            return ihave
        heads = dict(ihave.heads)
        for origin, head in shown.items():
            if origin in heads:
                heads[origin] = min(heads[origin], head)
        return IHave(heads, ihave.floors)

    def committed(self, held: Iterable[tuple[str, int, bool]]) -> None:
        """Messages ``(origin, origin_seq, binary)`` committed here: one without
        ``data_enc`` above a shown head lets the peer see our head again."""
        if not self.shown:
            return
        for origin, seq, binary in held:
            if binary:
                continue
            for node, shown in list(self.shown.items()):
                if shown.get(origin, seq) < seq:
                    del shown[origin]
                    if not shown:
                        del self.shown[node]

    def forget(self, node: str) -> None:
        """The link to ``node`` went down."""
        self.shown.pop(node, None)
