"""What a call frame costs on a switched direct link (spec §8, docs/mesh.md "Direct
upgrade"): CPU per reply frame of a stream sent from b to a on a direct link whose
switch settled and retired (the relayed sequence kept for a fall-back), as the switch
leaves the link (``switched``: up to 2026-11-27 a ``pframe`` in the kept sequence,
numbered, kept until acknowledged, acknowledged every 32; now plain, the calls sending
again themselves what a fall-back lost) against the same frame sent plainly on a link
with no sequencer at all (``plain``). Pure: the two ends of
tests/mesh/test_path_switch_ends.py (path cores, path switches, relay sessions; the
direct link a queue), no sockets.

Each round sends ``--frames`` reply frames one way and hands each to the other end as
its link would (the frame decoded once, a path frame taken into the sequence and its
inner frame decoded too; acks carried back every ``ACK_BATCH`` frames); the modes
alternate round by round, in alternating order, and the median per frame is reported,
with the frames of the last ``switched`` round that went in the sequence.

Run: python -m bench.bench_switch_calls [--frames 20000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import time

import cbor2

from bench.common import save
from hearthnet.mesh.path_frames import PATH_FRAME_TYPES
from hearthnet.mesh.path_switch import RETIRE_S
from hearthnet.mesh.protocol import encode_frame
from hearthnet.mesh.relay_frames import decode
from tests.mesh.test_path_switch_ends import End, _frame, _pair, _pump

ACK_BATCH = 64  # frames between two turns of the pump (the acks go back then)
_PFRAME_HEAD = b"\x61t\x66pframe"  # after the map's first byte: a path frame


def _settled_pair() -> tuple[End, End]:
    """a and b with a direct link whose switch settled and retired at both ends."""
    a, b = _pair()
    a.send(_frame(1), 0.0)
    _pump(a, 0.0)
    a.direct_link(1.0)
    b.direct_link(1.0)
    _pump(a, 1.0)
    for end in (a, b):
        end.tick(1.0 + RETIRE_S)
    _pump(a, 1.0 + RETIRE_S)
    return a, b


def _round(frames: int, *, switched: bool) -> tuple[float, int]:
    """Seconds per reply frame, b to a, in one mode, and the frames sent in the
    sequence."""
    a, b = _settled_pair()
    link, direct = b.direct, a.direct
    assert link is not None
    assert direct is not None
    if not switched:  # no sequencer at all: every frame plainly
        link.sequencer = None
    sequenced = b.switch.sequenced
    replies = [
        encode_frame("frame", sid="s1", f={"event": "token", "data": {"i": i}})
        for i in range(frames)
    ]
    now = 2.0 + RETIRE_S
    start = time.perf_counter()
    for i, reply in enumerate(replies):
        b.send(reply, now)
        while link.queued:
            data = link._queue.popleft()
            if data[1:10] == _PFRAME_HEAD:  # into a's sequence; its frame decoded too
                held = len(a.delivered)
                frame = decode(data)
                assert isinstance(frame, PATH_FRAME_TYPES)
                a.switch.path_frame(direct, frame, now)
                for inner in a.delivered[held:]:
                    cbor2.loads(inner)
            else:
                a.delivered.append(cbor2.loads(data))  # a plain frame, decoded once
        if i % ACK_BATCH == ACK_BATCH - 1:
            _pump(a, now)  # a's acks back to b
    _pump(a, now)
    elapsed = time.perf_counter() - start
    assert len(a.delivered) >= frames
    return elapsed / frames, b.switch.sequenced - sequenced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    per: dict[str, list[float]] = {"plain": [], "switched": []}
    sequenced = 0
    for i in range(min(args.rounds, 50)):
        # the order alternates too: a round run second in a pair ran slower (the first
        # one's garbage), which made one mode look dearer than the other when equal
        for mode in ("plain", "switched") if i % 2 == 0 else ("switched", "plain"):
            took, went = _round(args.frames, switched=mode == "switched")
            per[mode].append(took * 1e6)
            sequenced = went if mode == "switched" else sequenced
    med = {mode: statistics.median(v) for mode, v in per.items()}
    save(
        "switch_calls",
        {
            "frames": args.frames,
            "rounds": args.rounds,
            "us_per_frame": {m: round(v, 2) for m, v in med.items()},
            "added_us_per_frame": round(med["switched"] - med["plain"], 2),
            "sequenced_frames_last_round": sequenced,
            "all_us": {m: [round(x, 2) for x in v] for m, v in per.items()},
        },
    )


if __name__ == "__main__":
    main()
