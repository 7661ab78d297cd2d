"""Loading the configuration (spec §9): defaults < TOML file < ``HEARTHNET_<SECTION>_<KEY>``
environment variables < command-line flags, each value checked against its key's type.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hearthnet.config.mesh_section import URL_KEYS, MeshSection, node_url_problem
from hearthnet.config.schema import (
    BusSection,
    LimitsSection,
    LlmSection,
    NodeSection,
    PubSubSection,
    SecuritySection,
    TransportSection,
    default_data_dir,
)
from hearthnet.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Config:
    """The effective configuration of a node."""

    node: NodeSection = field(default_factory=NodeSection)
    transport: TransportSection = field(default_factory=TransportSection)
    security: SecuritySection = field(default_factory=SecuritySection)
    limits: LimitsSection = field(default_factory=LimitsSection)
    bus: BusSection = field(default_factory=BusSection)
    pubsub: PubSubSection = field(default_factory=PubSubSection)
    llm: LlmSection = field(default_factory=LlmSection)
    mesh: MeshSection = field(default_factory=MeshSection)

    @property
    def data_path(self) -> Path:
        """The data directory as a path (defaults applied)."""
        return Path(self.node.data_dir).expanduser() if self.node.data_dir else default_data_dir()


def sections() -> dict[str, type[Any]]:
    """Section name -> dataclass, in documentation order."""
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config)}


def _coerce(value: Any, kind: Any, where: str) -> Any:
    origin = typing.get_origin(kind)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
    elif kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif kind is str:
        if isinstance(value, str):
            return value
    elif origin is tuple:
        item_kind = typing.get_args(kind)[0]
        if isinstance(value, str) and typing.get_origin(item_kind) is dict:
            value = _json_tables(value, where)
        elif isinstance(value, str):
            value = [v for v in (p.strip() for p in value.split(",")) if v]
        if isinstance(value, list | tuple):
            return tuple(_coerce(v, item_kind, where) for v in value)
    elif origin in (dict, Mapping) or kind is dict:
        if isinstance(value, dict):
            return value
    elif isinstance(kind, types.UnionType) or origin is typing.Union:
        for option in typing.get_args(kind):
            if option is type(None) and value is None:
                return None
            try:
                return _coerce(value, option, where)
            except ConfigError:
                continue
    kind_name = getattr(kind, "__name__", str(kind))
    raise ConfigError(f"{where}: expected {kind_name}, got {value!r}")


def _json_tables(text: str, where: str) -> Any:
    """A list of tables given as one string (an environment variable): a JSON array of
    objects, ``[{"pattern": "chat.**", "subscribe": "member", "publish": "member"}]``."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(
            f"{where}: expected a JSON array of objects, like"
            ' [{"pattern": "chat.**", ...}], got ' + repr(text[:80])
        )
    return value


def _did_you_mean(name: str, known: typing.Iterable[str]) -> str:
    """`` (did you mean X?)`` for the known name nearest a misspelt one, or nothing."""
    import difflib  # noqa: PLC0415 - only for this error (spec §11: start time)

    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _apply(
    section_cls: type[Any], section_name: str, values: Mapping[str, Any], base: Any, source: str
) -> Any:
    hints = typing.get_type_hints(section_cls)
    fields = {f.name: f for f in dataclasses.fields(section_cls)}
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(
                f"{source}: unknown key [{section_name}] {key}{_did_you_mean(key, fields)}"
            )
        changes[key] = _coerce(value, hints[key], f"{source} [{section_name}] {key}")
        _check_value(fields[key], changes[key], f"{source} [{section_name}] {key}")
        if section_cls is MeshSection and key in URL_KEYS:
            _check_urls(changes[key], key, f"{source} [{section_name}] {key}")
        if section_cls is NodeSection and key == "port" and not 0 <= changes[key] <= 65535:
            raise ConfigError(
                f"{source} [{section_name}] port: {changes[key]} is not a port (0 to 65535;"
                " 0 picks a free one)"
            )
    return dataclasses.replace(base, **changes) if changes else base


def _check_value(key: dataclasses.Field[Any], value: Any, where: str) -> None:
    """The value is one the key takes: one of its choices; a number not below 0, and above
    0 for a key that says how often something runs."""
    choices = key.metadata.get("choices", ())
    if choices and value not in choices:
        raise ConfigError(f"{where}: {value!r} is not one of {', '.join(choices)}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value != value:  # noqa: PLR0124 - NaN, the one value unequal to itself
            raise ConfigError(f"{where}: {value!r} is not a number")
        if key.metadata.get("positive") and not value > 0:
            raise ConfigError(
                f"{where}: {value!r} must be more than 0 (a period: how often it runs)"
            )
        if value < 0:
            raise ConfigError(f"{where}: {value!r} must not be negative")


def _check_urls(value: tuple[str, ...] | str, key: str, where: str) -> None:
    """Each address of a [mesh] URL key is a node URL (``advertise_url`` may be empty)."""
    for url in (value,) if isinstance(value, str) else value:
        if key == "advertise_url" and not url:
            continue
        problem = node_url_problem(url, mesh_ok=key == "federation_peers")
        if problem is not None:
            raise ConfigError(f"{where}: {problem}")


def load_config(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> Config:
    """Build the effective configuration: defaults < TOML file < environment < overrides.

    Args:
        path: a TOML file; a missing file is fine only when it is the default path
            (pass ``None`` to skip files entirely).
        env: environment to read ``HEARTHNET_<SECTION>_<KEY>`` from (default: os.environ).
        overrides: ``{section: {key: value}}`` from command-line flags.

    Raises:
        ConfigError: unknown section or key, wrong type, unreadable TOML.
    """
    env = os.environ if env is None else env
    file_values: dict[str, Any] = {}
    if path is not None and path.exists():
        try:
            file_values = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    config = Config()
    known_sections = sections()
    for name in file_values:
        if name not in known_sections:
            raise ConfigError(
                f"{path}: unknown section [{name}]{_did_you_mean(name, known_sections)}"
            )
    changes: dict[str, Any] = {}
    for name, cls in known_sections.items():
        current = getattr(config, name)
        table = file_values.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [{name}] must be a table")
        current = _apply(cls, name, table, current, str(path))
        prefix = f"HEARTHNET_{name.upper()}_"
        # Only variables that name a key: HEARTHNET_* is one namespace shared with variables
        # that are not configuration (the LLM API key, HEARTHNET_LLM_API_KEY by default).
        fields = {f.name for f in dataclasses.fields(cls)}
        env_values = {
            key: v
            for k, v in env.items()
            if k.startswith(prefix) and (key := k[len(prefix) :].lower()) in fields
        }
        if name == "node" and "HEARTHNET_DATA_DIR" in env and "data_dir" not in env_values:
            env_values["data_dir"] = env["HEARTHNET_DATA_DIR"]
        current = _apply(cls, name, env_values, current, "environment")
        if overrides and name in overrides:
            current = _apply(cls, name, overrides[name], current, "command line")
        changes[name] = current
    return dataclasses.replace(config, **changes)


def stray_environment(config: Config, env: Mapping[str, str] | None = None) -> list[str]:
    """One sentence per ``HEARTHNET_*`` variable that names no configuration key, for the
    node to log as a warning: such a variable is left alone (``HEARTHNET_*`` is shared with
    variables that are not configuration), so a misspelt one (``HEARTHNET_LOG_LEVEL`` for
    ``HEARTHNET_NODE_LOG_LEVEL``) would otherwise change nothing without a word.

    Not named: ``HEARTHNET_DATA_DIR`` and the variable ``llm.api_key_env`` names (the
    model server's key, whose value is never shown).
    """
    env = os.environ if env is None else env
    prefix = "HEARTHNET_"
    names = sorted(n for n in env if n.startswith(prefix))
    if not names:
        return []
    known = {  # without the prefix, which every name shares, so it makes no name nearer
        f"{name.upper()}_{f.name.upper()}"
        for name, cls in sections().items()
        for f in dataclasses.fields(cls)
    }
    allowed = {*(prefix + k for k in known), prefix + "DATA_DIR", config.llm.api_key_env}
    return [
        f"environment variable {name} is ignored: it names no configuration key"
        + (
            _did_you_mean(name.removeprefix(prefix), known).replace("mean ", "mean " + prefix)
            or " (docs/configuration.md lists them)"
        )
        for name in names
        if name not in allowed
    ]
