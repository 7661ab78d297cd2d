"""Writing the configuration out: the effective values as TOML (``hearthnet config show``)
and the table of every key for docs/configuration.md (scripts/gen_config_docs.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hearthnet.config.loading import Config, sections
from hearthnet.errors import ConfigError


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if value is None:
        return '""'
    raise ConfigError(f"cannot write {value!r} as TOML")


def to_toml(config: Config) -> str:
    """The effective configuration as a TOML document (``hearthnet config show``)."""
    lines: list[str] = []
    for name in sections():
        section = getattr(config, name)
        lines.append(f"[{name}]")
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if isinstance(value, tuple) and value and all(isinstance(v, dict) for v in value):
                continue  # arrays of tables are written after the plain keys
            lines.append(f"{f.name} = {_toml_value(value)}")
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if isinstance(value, tuple) and value and all(isinstance(v, dict) for v in value):
                for item in value:
                    lines.append(f"[[{name}.{f.name}]]")
                    lines.extend(f"{k} = {_toml_value(v)}" for k, v in item.items())
        lines.append("")
    return "\n".join(lines)


def documented_keys() -> list[tuple[str, str, Any, str]]:
    """Every key as ``(section, key, default, doc)``: the source of docs/configuration.md."""
    rows = []
    defaults = Config()
    for name in sections():
        section = getattr(defaults, name)
        for f in dataclasses.fields(section):
            rows.append((name, f.name, getattr(section, f.name), f.metadata.get("doc", "")))
    return rows


def configuration_table() -> str:
    """The Markdown table of every key, default and meaning (embedded in docs/configuration.md)."""
    lines = ["| key | default | environment | meaning |", "|---|---|---|---|"]
    for section, key, default, doc in documented_keys():
        shown = _toml_value(default)
        lines.append(
            f"| `{section}.{key}` | `{shown}` | `HEARTHNET_{section.upper()}_{key.upper()}` "
            f"| {doc} |"
        )
    return "\n".join(lines) + "\n"
