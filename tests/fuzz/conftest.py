"""Fuzz suite fixtures: one live node per module, the ``fuzz`` marker, the input count."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

# Helpers whose asserts should explain themselves like a test's.
pytest.register_assert_rewrite("tests.fuzz.live", "tests.fuzz.oracle")

from tests.fuzz.live import LiveNode, live_node  # noqa: E402

# Inputs run in this session, per edge, summed over modules (for the terminal summary).
INPUTS: Counter[str] = Counter()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/fuzz is selectable with ``-m fuzz``."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.fuzz)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveNode]:
    """A node process shared by the module's fuzz tests, stopped by PID at the end."""
    with live_node(tmp_path_factory.mktemp("fuzz")) as node:
        try:
            yield node
        finally:
            INPUTS.update(node.inputs)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print how many inputs each edge received."""
    if INPUTS:
        terminalreporter.section("fuzz inputs")
        for edge, n in sorted(INPUTS.items()):
            terminalreporter.write_line(f"{edge}: {n}")
        terminalreporter.write_line(f"total: {sum(INPUTS.values())}")
