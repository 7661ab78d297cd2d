"""Code size limits (STYLE.md: a module is a few hundred lines, a class stays near 20
methods): no module in hearthnet/ over 600 lines, no class over 20 methods. Pure: reads
the source files, imports nothing of them."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "hearthnet"
MAX_MODULE_LINES = 600
MAX_CLASS_METHODS = 20  # public and private, properties and dunders included

# What is still over, with the size it may not pass. An entry goes once its module or
# class is split below the limit (the test says so); none is added.
MODULES_OVER: dict[str, int] = {}
CLASSES_OVER: dict[str, int] = {}


def module_lines() -> dict[str, int]:
    """Lines per module, by path under hearthnet/."""
    return {
        p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8").count("\n")
        for p in sorted(ROOT.rglob("*.py"))
    }


def _classes(body: list[ast.stmt]) -> Iterator[ast.ClassDef]:
    """The classes defined in ``body``, at any depth of statements (expressions, where
    no class is defined, are not walked: most of a tree's nodes)."""
    for stmt in body:
        if isinstance(stmt, ast.ClassDef):
            yield stmt
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list):
                yield from _classes(inner)
        for handler in getattr(stmt, "handlers", ()):
            yield from _classes(handler.body)


def class_methods() -> dict[str, int]:
    """Methods defined in each class's body, by ``path:Class``."""
    counts: dict[str, int] = {}
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for p in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(p.read_text(encoding="utf-8"))
        for node in _classes(tree.body):
            n = sum(isinstance(b, defs) for b in node.body)
            counts[f"{p.relative_to(ROOT).as_posix()}:{node.name}"] = n
    return counts


def over(sizes: dict[str, int], limit: int, allowed: dict[str, int]) -> dict[str, str]:
    """What breaks the limit beyond its allowance, and allowances no longer needed."""
    found: dict[str, str] = {}
    for name, size in sizes.items():
        if size > max(limit, allowed.get(name, limit)):
            found[name] = f"{size} (at most {max(limit, allowed.get(name, limit))})"
    for name in allowed:
        if sizes.get(name, 0) <= limit:
            found[name] = f"{sizes.get(name)}: within {limit} now, drop it from the list"
    return found


def test_no_module_passes_600_lines() -> None:
    """Every module of hearthnet/ has at most 600 lines, the listed ones their ceiling."""
    assert {} == over(module_lines(), MAX_MODULE_LINES, MODULES_OVER)


def test_no_class_passes_20_methods() -> None:
    """Every class of hearthnet/ has at most 20 methods, the listed ones their ceiling."""
    assert {} == over(class_methods(), MAX_CLASS_METHODS, CLASSES_OVER)


def test_the_check_sees_a_class_over_the_limit() -> None:
    """A class of 21 methods, or one listed that grew, is reported; a listed one that
    shrank within the limit is reported as an entry to drop."""
    sizes = {"a.py:Big": 21, "b.py:Listed": 23, "c.py:Done": 20}
    assert {
        "a.py:Big": "21 (at most 20)",
        "b.py:Listed": "23 (at most 22)",
        "c.py:Done": "20: within 20 now, drop it from the list",
    } == over(sizes, 20, {"b.py:Listed": 22, "c.py:Done": 24})
