"""The allowed-fields tables of client frames and bodies (spec §2.4). Pure."""

from __future__ import annotations

import pytest

from hearthnet.errors import BadRequest
from hearthnet.shapes import Shape

PING = Shape.of("ping frame", ("type",), {"ts": "pings carry no time"})


def refusal(shape: Shape, obj: dict[object, object]) -> str:
    """The message of the bad_request ``obj`` gets."""
    with pytest.raises(BadRequest) as refused:
        shape.check(obj)  # type: ignore[arg-type]
    return refused.value.message


def test_listed_fields_pass() -> None:
    """A frame with only listed fields (or fewer) passes without an error."""
    shape = Shape.of("ack frame", ("type", "upto"))
    shape.check({"type": "ack", "upto": 1})
    shape.check({})
    assert frozenset({"type", "upto"}) == shape.fields


def test_an_unknown_field_is_named_with_its_hint() -> None:
    """The refusal names the field and adds the hint known for it."""
    assert "unknown field 'ts' in ping frame (pings carry no time)" == refusal(
        PING, {"type": "ping", "ts": 1}
    )


def test_many_unknown_fields_are_named_up_to_four() -> None:
    """More than four unknown fields: four are named, the rest counted."""
    obj: dict[object, object] = {"type": "ping", **{f"f{i}": i for i in range(6)}}
    assert "unknown fields 'f0', 'f1', 'f2', 'f3' and 2 more in ping frame" == refusal(PING, obj)


def test_keys_that_are_not_strings_are_named_too() -> None:
    """A CBOR map may carry an integer key: it is refused like any other."""
    assert "unknown field '7' in ping frame" == refusal(PING, {"type": "ping", 7: "x"})


def test_query_parameters_are_called_parameters() -> None:
    """A query-string table says parameter, not field."""
    shape = Shape.query("history query", ("limit", "token"))
    assert "unknown parameter 'max' in history query" == refusal(shape, {"limit": 1, "max": 2})
