"""How ``hearthnet`` commands print (docs/cli.md): tables and sentences for people by
default, JSON with ``--json`` for scripts (field names documented and stable), and one JSON
object per line for streams (``sub``, ``call --stream``, ``bridge``) whatever the flag.

Errors go to stderr: ``hearthnet: CODE: message`` for people, one JSON object
``{"error", "message"}`` with ``--json``; the exit code says which kind (spec §9).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

JSON_HELP = "print JSON for scripts (fields in docs/cli.md)"
STREAM_JSON_HELP = "accepted for uniformity: this command always prints one JSON object per line"
MAX_CELL = 60
# Error codes of this machine (not of the wire, spec §2.4), shown only to scripts.
LOCAL_CODES = frozenset(
    {"node_not_running", "usage", "config_error", "identity_error", "storage_error", "error"}
)


def add_json_flag(parser: argparse.ArgumentParser, help_text: str = JSON_HELP) -> None:
    """Give a command the ``--json`` flag every command has."""
    parser.add_argument("--json", action="store_true", help=help_text)


def print_json(obj: Any) -> None:
    """One JSON document on stdout (indented: it is read by programs and people)."""
    print(json.dumps(obj, indent=2, ensure_ascii=False))


def print_json_line(obj: Any) -> None:
    """One JSON object on one line, flushed (a line of a stream)."""
    print(json.dumps(obj, ensure_ascii=False), flush=True)


def emit(args: argparse.Namespace, obj: Any, for_people: Callable[[], None]) -> None:
    """``obj`` as JSON with ``--json``, else what ``for_people`` prints."""
    if getattr(args, "json", False):
        print_json(obj)
    else:
        for_people()


@dataclass(frozen=True, slots=True)
class Column:
    """A table column: its header, how to get the cell from a row, and its alignment."""

    header: str
    cell: Callable[[Mapping[str, Any]], Any]
    right: bool = False


def cell_text(value: Any, limit: int | None = MAX_CELL) -> str:
    """A value as people read it: ``-`` for nothing, lists and objects joined, and (with a
    ``limit``) long text cut."""
    if value is None or (isinstance(value, str | list | tuple | dict) and not value):
        return "-"
    if isinstance(value, float):
        text = f"{value:.1f}"
    elif isinstance(value, list | tuple):
        text = ", ".join(cell_text(v, None) for v in value)
    elif isinstance(value, dict):
        text = ", ".join(f"{k}={cell_text(v, None)}" for k, v in value.items())
    else:
        text = str(value)
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


def table(rows: Iterable[Mapping[str, Any]], columns: list[Column]) -> str:
    """Rows under a header line, each column as wide as its widest cell."""
    cells = [[c.header for c in columns]]
    cells += [[cell_text(c.cell(row)) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = []
    for line in cells:
        parts = [
            text.rjust(width) if column.right else text.ljust(width)
            for text, width, column in zip(line, widths, columns, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def print_table(
    rows: Iterable[Mapping[str, Any]], columns: list[Column], empty: str = "(none)"
) -> None:
    """Print :func:`table`, or ``empty`` when there are no rows."""
    rows = list(rows)
    print(table(rows, columns) if rows else empty)


def print_fields(fields: Mapping[str, Any]) -> None:
    """``key  value`` lines, keys aligned; a section of sections (``/status``'s
    ``relaying``) gets a line per section, ``relaying.relay  members=2, ...``."""
    flat = list(_flat_fields(fields))
    if not flat:
        return
    width = max(len(k) for k, _ in flat)
    for key, value in flat:
        print(f"{key.ljust(width)}  {cell_text(value, None)}")


def _flat_fields(fields: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in fields.items():
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            yield from _flat_fields(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def print_error(args: argparse.Namespace | None, code: str, message: str, out: TextIO) -> None:
    """An error on stderr: a line for people, or ``{"error", "message"}`` with ``--json``."""
    if args is not None and getattr(args, "json", False):
        out.write(json.dumps({"error": code, "message": message}, ensure_ascii=False) + "\n")
    elif code in LOCAL_CODES:
        out.write(f"hearthnet: {message}\n")  # the message says it all; codes are for scripts
    else:
        out.write(f"hearthnet: {code}: {message}\n")


def key(name: str) -> Callable[[Mapping[str, Any]], Any]:
    """A column cell that is ``row[name]`` (None when missing)."""
    return lambda row: row.get(name)
