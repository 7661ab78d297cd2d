"""The allowed fields of each client frame and body (spec §2.4: a malformed frame is
``bad_request``). Pure.

Every wire keeps one table of :class:`Shape` values, one per frame type, so the fields a
node accepts are listed in one place. An unknown field is refused, never ignored: a
client that misspells a field (``last: 3`` instead of ``since: {"last": 3}``) learns it at
once instead of silently getting something else.

The check costs one subset test of the frame's keys against a frozenset; the message is
only built for a frame that fails it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from hearthnet.errors import BadRequest

_MAX_NAMED = 4


def _name(key: object) -> str:
    return repr(str(key)[:64])


@dataclass(frozen=True, slots=True)
class Shape:
    """The fields one frame type may carry.

    Attributes:
        what: how messages name the frame (``"subscribe frame"``, ``"publish body"``).
        fields: every allowed field, required or optional.
        hints: for a known mistake, the field that was probably meant (shown after the
            refusal).
        noun: what a field is called on this wire (``"parameter"`` in a query string).
    """

    what: str
    fields: frozenset[str]
    hints: Mapping[str, str] = field(default_factory=dict)
    noun: str = "field"

    @classmethod
    def of(cls, what: str, fields: Iterable[str], hints: Mapping[str, str] | None = None) -> Shape:
        """A shape from field names; ``hints`` maps a mistaken field to advice."""
        return cls(what, frozenset(fields), dict(hints or {}))

    @classmethod
    def query(cls, what: str, parameters: Iterable[str]) -> Shape:
        """The parameters of a query string."""
        return cls(what, frozenset(parameters), {}, "parameter")

    def check(self, obj: Mapping[str, object]) -> None:
        """Refuse ``obj`` (a decoded frame, a body, a query string) when it carries a
        field this shape does not list.

        Raises:
            BadRequest: naming the (first few) unknown fields, with a hint when one is known.
        """
        keys = obj.keys()
        if self.noun == "parameter" and len(obj) != len(keys):
            # A query string (a multidict: its length counts every item) repeats a key.
            self._refuse_repeated([key for key, _ in obj.items()])
        if keys <= self.fields:
            return
        self.refuse(keys)

    def _refuse_repeated(self, keys: list[object]) -> None:
        """A parameter given more than once is refused (only the first would be read)."""
        for key in dict.fromkeys(keys):
            if (count := keys.count(key)) > 1:
                hint = " (list them: topics=a.b,c.*)" if key in ("topics", "topic") else ""
                raise BadRequest(f"parameter {_name(key)} given {count} times in {self.what}{hint}")

    def refuse(self, keys: Iterable[object]) -> NoReturn:
        """Raise the ``bad_request`` for the keys of a frame that failed :meth:`check`."""
        unknown = list(dict.fromkeys(k for k in keys if k not in self.fields))
        names = ", ".join(_name(k) for k in unknown[:_MAX_NAMED])
        plural = "s" if len(unknown) > 1 else ""
        more = f" and {len(unknown) - _MAX_NAMED} more" if len(unknown) > _MAX_NAMED else ""
        message = f"unknown {self.noun}{plural} {names}{more} in {self.what}"
        hint = next(
            (self.hints[k] for k in unknown if isinstance(k, str) and k in self.hints), None
        )
        if hint is not None:
            message += f" ({hint})"
        raise BadRequest(message)
