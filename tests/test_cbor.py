"""hearthnet.cbor: cbor2 imported on first use, with cbor2's own functions after it."""

from __future__ import annotations

import subprocess
import sys

import cbor2
import pytest

from hearthnet import cbor

PROGRAM = """
import sys
from hearthnet import cbor
before = "cbor2" in sys.modules
data = cbor.dumps({"a": b"x"})
print(before, "cbor2" in sys.modules, cbor.loads(data) == {"a": b"x"}, "dumps" in vars(cbor))
"""


def test_cbor2_is_imported_by_the_first_use_and_kept() -> None:
    """Importing hearthnet.cbor loads no cbor2; the first look-up does and keeps the name."""
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=False
    )
    assert "False True True True" == done.stdout.strip(), done.stderr


def test_the_names_are_cbor2s() -> None:
    """What callers get is cbor2's own, so encoding and errors are unchanged."""
    assert (cbor2.dumps, cbor2.loads, cbor2.CBORDecodeError, cbor2.CBOREncoder) == (
        cbor.dumps,
        cbor.loads,
        cbor.CBORDecodeError,
        cbor.CBOREncoder,
    )


def test_an_unknown_name_is_an_attribute_error() -> None:
    """A name the module does not offer fails like any missing attribute."""
    with pytest.raises(AttributeError, match="CBORTag"):
        cbor.CBORTag  # noqa: B018 - the look-up is the test
