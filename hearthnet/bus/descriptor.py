"""Capability descriptors and version matching (spec §2.1)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from hearthnet.bus.envelope import validate_capability_name, validate_version
from hearthnet.community import Level
from hearthnet.errors import BadRequest, SchemaMismatch

STABILITIES = ("stable", "beta", "experimental")
VALIDATOR_CACHE_SIZE = 1024


def _not_loaded(errors: Iterator[Any]) -> Any:
    raise RuntimeError("jsonschema is not loaded yet")  # pragma: no cover


# jsonschema's pick of the most relevant error; set when jsonschema is loaded, by the
# first schema checked (jsonschema takes ~0.1 s to import, which a node's start does not
# pay: spec §11)
_best_match: Callable[[Iterator[Any]], Any] = _not_loaded


@functools.lru_cache(maxsize=VALIDATOR_CACHE_SIZE)
def _compiled(schema_json: bytes) -> Any:
    global _best_match  # noqa: PLW0603 - set once, on the first schema checked
    from jsonschema import Draft202012Validator  # noqa: PLC0415 - loaded on first use
    from jsonschema.exceptions import best_match  # noqa: PLC0415

    _best_match = best_match
    schema = orjson.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


MAX_SCHEMA_MESSAGE_CHARS = 200


def schema_error_text(error: Any) -> str:
    """A jsonschema error's message, short: one that quotes a big value (17 tools, a long
    string) names its size and the rule instead, so the limit is not cut off."""
    message: str = error.message
    if len(message) <= MAX_SCHEMA_MESSAGE_CHARS:
        return message
    value = error.instance
    if isinstance(value, list | dict):
        what = f"{len(value)} items"
    elif isinstance(value, str):
        what = f"a string of {len(value)} characters"
    else:
        what = type(value).__name__
    rule = orjson.dumps(error.validator_value, default=str).decode()[:80]
    return f"{what}: fails {error.validator} {rule}"


def compiled_validator(schema: dict[str, Any]) -> Any:
    """A checked, compiled validator for ``schema``; :class:`jsonschema.SchemaError` if the
    schema is invalid. Checking a schema against the meta-schema costs about a millisecond,
    and the same schemas come back all the time (every peer's ``caps`` announcement, every
    SSE re-call of a tool loop), so validators are cached by the schema's canonical JSON
    (bounded)."""
    return _compiled(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))


@functools.lru_cache(maxsize=1024)
def parse_version(version: str) -> tuple[int, int]:
    """``"2.1"`` -> ``(2, 1)``."""
    major, minor = validate_version(version).split(".")
    return int(major), int(minor)


def version_satisfies(offered: str, requested: str) -> bool:
    """An offered ``X.Y`` satisfies a request for ``A.B`` iff ``X == A and Y >= B``."""
    x, y = parse_version(offered)
    a, b = parse_version(requested)
    return x == a and y >= b


@dataclass(frozen=True, slots=True)
class CapabilityDescriptor:
    """What a capability offers and on what terms."""

    name: str
    version: str
    request_schema: dict[str, Any] = field(default_factory=dict)
    response_schema: dict[str, Any] | None = None
    stream_schema: dict[str, Any] | None = None
    stability: str = "stable"
    max_concurrent: int = 64
    timeout_s: float = 30.0
    min_level: Level = Level.MEMBER
    idempotent: bool = False
    description: str = ""
    # When ``request_schema`` is checked and compiled: at construction (the default, for
    # descriptors from outside the code: a peer's announcement, a configured tool), or,
    # for the node's own capabilities whose schemas are constants of the code (checked by
    # tests/bus/test_registry.py), on their first call, so that starting a node does not
    # load jsonschema (spec §11: start to ready < 1 s).
    check_on_first_call: bool = field(default=False, compare=False, repr=False)
    _validator: Any = field(default=None, compare=False, repr=False)
    # ``name@version``, made once: every call reads it to take and give back its slot
    key: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        validate_capability_name(self.name)
        validate_version(self.version)
        object.__setattr__(self, "key", f"{self.name}@{self.version}")
        if self.stability not in STABILITIES:
            raise BadRequest(f"stability must be one of {STABILITIES}")
        if self.max_concurrent < 1 or self.timeout_s <= 0:
            raise BadRequest("max_concurrent must be >= 1 and timeout_s > 0")
        if not self.check_on_first_call:
            self.check_schema()

    def check_schema(self) -> Any:
        """Check ``request_schema`` and compile its validator, kept (and shared with every
        descriptor of the same schema): validation runs on every call.

        Raises:
            BadRequest: the schema is invalid, or not JSON.
        """
        try:
            validator = compiled_validator(self.request_schema)
        except (TypeError, orjson.JSONEncodeError) as exc:
            raise BadRequest(f"{self.name}: request_schema is not JSON: {exc}") from exc
        except Exception as exc:
            from jsonschema import SchemaError  # noqa: PLC0415 - loaded by the check above

            if not isinstance(exc, SchemaError):
                raise
            raise BadRequest(f"{self.name}: invalid request_schema: {exc.message}") from exc
        object.__setattr__(self, "_validator", validator)
        return validator

    @property
    def streaming(self) -> bool:
        """A capability with a ``stream_schema`` answers with a stream of frames."""
        return self.stream_schema is not None

    def validate_input(self, value: Any) -> None:
        """Validate a request input against ``request_schema``.

        Raises:
            SchemaMismatch: with the first error's path and message.
        """
        validator = self._validator
        if validator is None:
            if not self.request_schema:
                return  # {} accepts every value: nothing to compile
            validator = self.check_schema()
        error = _best_match(validator.iter_errors(value))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise SchemaMismatch(f"input at {where}: {schema_error_text(error)}"[:500])

    def to_json(self) -> dict[str, Any]:
        """The descriptor as listed by ``/bus/v1/capabilities`` and the manifest."""
        return {
            "name": self.name,
            "version": self.version,
            "stability": self.stability,
            "request_schema": self.request_schema,
            "response_schema": self.response_schema,
            "stream_schema": self.stream_schema,
            "max_concurrent": self.max_concurrent,
            "timeout_s": self.timeout_s,
            "min_level": self.min_level.label,
            "idempotent": self.idempotent,
            "description": self.description,
        }

    def summary(self) -> dict[str, Any]:
        """The short form used in the signed manifest (spec §7.1)."""
        return {"name": self.name, "version": self.version, "streaming": self.streaming}
