"""``cbor2``, imported on first use (spec §11: idle RSS).

CBOR is what peer links, relays and CBOR clients speak; a node with none of them never
needs it, and ``cbor2`` with its C extension holds ~0.7 MiB once imported. Code uses this
module where it used ``cbor2``::

    from hearthnet import cbor

    cbor.dumps(obj), cbor.loads(data), cbor.CBORDecodeError, cbor.CBOREncoder

The first look-up of a name imports ``cbor2`` and stores the name here, so every later
``cbor.dumps`` is a plain module attribute, as fast as ``cbor2.dumps``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cbor2 import CBORDecodeError, CBOREncoder, dumps, loads

# what callers may use: a typo stays an AttributeError instead of importing cbor2
__all__ = ["CBORDecodeError", "CBOREncoder", "dumps", "loads"]


def __getattr__(name: str) -> Any:
    """The name from ``cbor2``, importing it the first time (PEP 562)."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("cbor2"), name)
    globals()[name] = value  # later look-ups no longer come here
    return value
