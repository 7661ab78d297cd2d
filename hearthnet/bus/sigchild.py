"""The signature checker process (:class:`hearthnet.bus.signatures.SignatureWorker`).

Reads batches on stdin, each 4 bytes of length (big-endian) then checks of 100 + n
bytes: public key (32), signature (64), message length n (4, big-endian), message.
Answers each batch on stdout with 4 bytes of count then one byte per check, in order:
1 when the ed25519 signature verifies, 0 otherwise. Exits at the end of its input. Only
the libsodium call runs here; everything that can refuse a call for its form is decided
by the node before a check is sent.
"""

from __future__ import annotations

import os

from nacl.bindings import crypto_sign_open

_READ_BYTES = 1 << 20


def answers(blob: bytes) -> bytes:
    """One byte per check of a batch: 1 verified, 0 not (or cut short)."""
    out = bytearray()
    at = 0
    view = memoryview(blob)
    while at + 100 <= len(blob):
        key = blob[at : at + 32]
        size = int.from_bytes(view[at + 96 : at + 100], "big")
        end = at + 100 + size
        if end > len(blob):
            out.append(0)
            break
        try:
            crypto_sign_open(blob[at + 32 : at + 96] + blob[at + 100 : end], key)
        except Exception:  # BadSignatureError, or a key libsodium refuses
            out.append(0)
        else:
            out.append(1)
        at = end
    return len(out).to_bytes(4, "big") + bytes(out)


def main() -> None:
    """Answer batches until stdin ends."""
    buf = bytearray()
    while True:
        data = os.read(0, _READ_BYTES)
        if not data:
            return
        buf += data
        while len(buf) >= 4:
            size = int.from_bytes(buf[:4], "big")
            if len(buf) < 4 + size:
                break
            blob = bytes(buf[4 : 4 + size])
            del buf[: 4 + size]
            reply = answers(blob)
            while reply:
                reply = reply[os.write(1, reply) :]


if __name__ == "__main__":
    main()
