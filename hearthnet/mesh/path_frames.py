"""Path frames (spec §8): the direct upgrade and one frame sequence per peer across paths.

They travel sealed through a relay (``sealed.f``) or plainly on a direct link::

    candidates {nonce, addrs}        the addresses to punch (observed address first)
    punch {nonce, in_ms}             start the simultaneous open at the same moment
    upgrade {nonce}                  first frame on the punched link
    pframe {s, f, e, a}              peer-link frame f, number s of sender's sequence e
    pack {upto, drained?, e}         every pframe of sequence e up to upto was delivered
    drain {upto, e}                  the old path's last pframe is upto

See :mod:`hearthnet.mesh.paths` and :mod:`hearthnet.mesh.pathseq` for how they are used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hearthnet.errors import BadRequest
from hearthnet.mesh.frame_fields import (
    MAX_ADDRS,
    MAX_INNER_BYTES,
    MAX_NONCE_CHARS,
    Frame,
    bytes_field,
    check_addr,
    int_field,
    punchable_addr,
    str_field,
)
from hearthnet.shapes import Shape

MAX_PUNCH_DELAY_MS = 10_000


@dataclass(frozen=True, slots=True)
class Candidates(Frame):
    """The addresses one end may be reached at (its observed address first), for a punch
    attempt ``nonce``; the answer echoes the nonce."""

    KIND: ClassVar[str] = "candidates"
    SHAPE: ClassVar[Shape] = Shape.of("candidates frame", ("t", "nonce", "addrs"))
    nonce: str
    addrs: tuple[str, ...]

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Candidates:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        raw = obj.get("addrs")
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_ADDRS:
            raise BadRequest(f"candidates.addrs must be a list of 1..{MAX_ADDRS} addresses")
        addrs = tuple(check_addr(a, "candidates.addrs[]") for a in raw)
        # spec §8: only addresses a punch may go to are kept (none left: no punch)
        punchable = tuple(a for a in addrs if punchable_addr(a))
        return cls(str_field(obj, "candidates", "nonce", MAX_NONCE_CHARS), punchable)

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "nonce": self.nonce, "addrs": list(self.addrs)}


@dataclass(frozen=True, slots=True)
class Punch(Frame):
    """Initiator -> responder: start the simultaneous open ``in_ms`` after this frame
    arrives; the initiator starts ``in_ms`` plus half the measured RTT after sending it,
    so both start at the same moment."""

    KIND: ClassVar[str] = "punch"
    SHAPE: ClassVar[Shape] = Shape.of("punch frame", ("t", "nonce", "in_ms"))
    nonce: str
    in_ms: int

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Punch:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(
            str_field(obj, "punch", "nonce", MAX_NONCE_CHARS),
            int_field(obj, "punch", "in_ms", 0, MAX_PUNCH_DELAY_MS),
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "nonce": self.nonce, "in_ms": self.in_ms}


@dataclass(frozen=True, slots=True)
class Upgrade(Frame):
    """First frame on a punched direct link (after its hellos): it belongs to attempt
    ``nonce``, and the peer's frames move to it (see :mod:`hearthnet.mesh.paths`)."""

    KIND: ClassVar[str] = "upgrade"
    SHAPE: ClassVar[Shape] = Shape.of("upgrade frame", ("t", "nonce"))
    nonce: str

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Upgrade:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(str_field(obj, "upgrade", "nonce", MAX_NONCE_CHARS))

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "nonce": self.nonce}


@dataclass(frozen=True, slots=True)
class PFrame(Frame):
    """Peer frame ``f`` numbered ``s`` in the sender's sequence to this peer (across paths).
    ``e`` is the sequence's epoch (the sender's start time, ms; a restart starts a new
    sequence) and ``a`` the highest ``s`` the receiver has acknowledged (a receiver that
    restarted resumes after it). ``s`` 0: outside the sequence (a heartbeat; see
    :mod:`hearthnet.mesh.pathseq`)."""

    KIND: ClassVar[str] = "pframe"
    SHAPE: ClassVar[Shape] = Shape.of("pframe frame", ("t", "s", "f", "e", "a"))
    s: int
    f: bytes
    e: int = 0
    a: int = 0

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> PFrame:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(
            int_field(obj, "pframe", "s", 0),
            bytes_field(obj, "pframe", "f", MAX_INNER_BYTES),
            int_field(obj, "pframe", "e"),
            int_field(obj, "pframe", "a"),
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "s": self.s, "f": self.f, "e": self.e, "a": self.a}


@dataclass(frozen=True, slots=True)
class PAck(Frame):
    """Every ``pframe`` of epoch ``e`` up to ``upto`` was delivered; the sender may forget
    them. ``drained``: this ack answers a ``drain``, so frames up to the drained ``upto``
    that it does not cover were lost on the old path."""

    KIND: ClassVar[str] = "pack"
    SHAPE: ClassVar[Shape] = Shape.of("pack frame", ("t", "upto", "drained", "e"))
    upto: int
    drained: bool = False
    e: int = 0

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> PAck:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        drained = obj.get("drained", False)
        if not isinstance(drained, bool):
            raise BadRequest("pack.drained must be a boolean")
        return cls(int_field(obj, "pack", "upto"), drained, int_field(obj, "pack", "e"))

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        out: dict[str, Any] = {"t": self.KIND, "upto": self.upto, "e": self.e}
        if self.drained:
            out["drained"] = True
        return out


@dataclass(frozen=True, slots=True)
class Drain(Frame):
    """The last ``pframe`` of epoch ``e`` this path carries is ``upto``; later ones take the
    new path."""

    KIND: ClassVar[str] = "drain"
    SHAPE: ClassVar[Shape] = Shape.of("drain frame", ("t", "upto", "e"))
    upto: int
    e: int = 0

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Drain:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(int_field(obj, "drain", "upto"), int_field(obj, "drain", "e"))

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "upto": self.upto, "e": self.e}


PathFrame = Candidates | Punch | Upgrade | PFrame | PAck | Drain
PATH_FRAME_TYPES = (Candidates, Punch, Upgrade, PFrame, PAck, Drain)
