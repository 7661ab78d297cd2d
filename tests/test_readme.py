"""The README's two commands and .ci/run stay in step (the newcomer's path is CI's path)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
)
START_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/hearthnet node start"
)


def test_readme_has_the_two_commands() -> None:
    """The README shows the install-and-start and install-and-test commands."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert (True, True) == (START_COMMAND in readme, TEST_COMMAND in readme)


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run ends with the README's test command, unchanged."""
    lines = [
        ln
        for ln in (ROOT / ".ci" / "run").read_text().splitlines()
        if ln and not ln.startswith("#")
    ]
    assert TEST_COMMAND == lines[-1]
