"""Sampling profiles of benchmark node processes with py-spy (``pip install py-spy``).

:class:`Spy` records the stacks of some processes (by PID) from :meth:`Spy.start` until
:meth:`Spy.stop`, as py-spy's raw (collapsed) format, one file per process, and
:func:`shares` reads such a file back into the numbers a benchmark reports: the samples,
the share spent idle in the event loop, the functions most often on top of the stack, and
the share of samples inside chosen groups of modules.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

# py-spy's raw format names a frame "function (file:line)"; these leaves are the loop idle
_IDLE = ("Runner.run (asyncio/runners.py", "select (selectors.py", "_run_once (asyncio/")
_RAW = ("--nonblocking", "--format", "raw", "-o")  # don't stop the process; stacks as text
STOP_TIMEOUT_S = 60.0  # py-spy writes its file after SIGINT; a bound on the wait


class Spy:
    """py-spy recording ``pids`` (name -> PID) into ``out_dir``/NAME.txt."""

    def __init__(self, out_dir: Path, pids: dict[str, int], rate: int = 100) -> None:
        exe = shutil.which("py-spy")
        if exe is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy)")
        out_dir.mkdir(parents=True, exist_ok=True)
        self.files = {name: out_dir / f"{name}.txt" for name in pids}
        self._procs: list[subprocess.Popen[bytes]] = []
        for name, pid in pids.items():
            argv = [exe, "record", "--pid", str(pid), "--rate", str(rate), *_RAW]
            self._procs.append(
                subprocess.Popen(
                    [*argv, str(self.files[name])],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )

    def stop(self, groups: dict[str, tuple[str, ...]]) -> dict[str, Any]:
        """Stop recording (SIGINT, then py-spy writes its file) and read each file back
        (:func:`shares`)."""
        for proc in self._procs:
            proc.send_signal(signal.SIGINT)
        for proc in self._procs:
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return {name: shares(path, groups) for name, path in self.files.items() if path.exists()}


def shares(path: Path, groups: dict[str, tuple[str, ...]], top: int = 6) -> dict[str, Any]:
    """Samples in a raw py-spy file: how many, the share idle in the event loop, the
    ``top`` leaf functions' shares, and each group's own share: samples whose innermost
    ``hearthnet/`` frame is in a file whose path contains one of the group's strings
    (the group's code itself running, or the library calls it made)."""
    total = 0
    idle = 0
    leaves: Counter[str] = Counter()
    inside: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        leaves[frames[-1]] += n
        idle += n if frames[-1].startswith(_IDLE) else 0
        own = next((f for f in reversed(frames) if "hearthnet/" in f), "")
        for group, parts in groups.items():
            if any(part in own for part in parts):
                inside[group] += n
    if total == 0:
        return {"samples": 0}
    return {
        "samples": total,
        "idle_share": round(idle / total, 3),
        "top": {leaf: round(n / total, 3) for leaf, n in leaves.most_common(top)},
        "groups": {group: round(inside[group] / total, 3) for group in groups},
    }
