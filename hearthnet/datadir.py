"""What a running node keeps in its data directory besides its data (spec §9): the lock
that allows one node per directory, and the run file that tells the CLI where it runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
from pathlib import Path
from typing import IO, TYPE_CHECKING

from hearthnet.config.schema import default_data_dir
from hearthnet.errors import ConfigError

if TYPE_CHECKING:
    from hearthnet.config import NodeSection


def start_command(data_dir: Path) -> str:
    """What to type to start the node of ``data_dir`` (for errors that say what to do):
    ``hearthnet node start``, with ``--data-dir`` unless it is the default one."""
    if data_dir.expanduser().resolve() == default_data_dir().resolve():
        return "hearthnet node start"
    return f"hearthnet node start --data-dir {shlex.quote(str(data_dir))}"


class DataDirLock:
    """An exclusive lock on ``<data_dir>/run/lock``: one node per data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "run" / "lock"
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`ConfigError` naming the holder (or saying that
        the data directory cannot be made)."""
        data_dir = self.path.parent.parent
        try:
            data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.path.parent.mkdir(exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot make the data directory {data_dir}: {exc.strerror} (pass --data-dir"
                " DIR of a place this user may write)"
            ) from exc
        f = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise ConfigError(
                f"another node is running with data dir {self.path.parent.parent} (pid {holder})"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._file = f

    def release(self) -> None:
        """Give the lock back."""
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


class RunFile:
    """``<data_dir>/run/node.json``: where a running node is (spec §9; the CLI reads it
    with :func:`hearthnet.client.find_running_node`)."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "run" / "node.json"

    def write(self, *, url: str, node: str, community: str, started_ms: int) -> None:
        """Record the running node (atomically: a reader never sees half a file)."""
        info = {
            "url": url,
            "pid": os.getpid(),
            "node": node,
            "community": community,
            "started_ms": started_ms,
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(info) + "\n", encoding="utf-8")
        tmp.replace(self.path)

    def remove(self) -> None:
        """The node stopped."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class NameFile:
    """``<data_dir>/name``: the name this node was last given (``--name``, ``[node] name``
    or ``HEARTHNET_NODE_NAME``), so a later start given none keeps it (spec §9).

    One line of UTF-8. Delete it, with the node stopped, to go back to the default name
    (the host name and the start of the short id).
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "name"

    def read(self) -> str:
        """The remembered name; ``""`` when none was given yet.

        Raises:
            ConfigError: the file cannot be read or is not UTF-8 (it names the file).
        """
        try:
            return self.path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return ""
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
            raise ConfigError(
                f"cannot read the node's name from {self.path}: {why} (fix or delete the file)"
            ) from exc

    def name_of(self, node: NodeSection, node_id: str, *, remember: bool) -> str:
        """The node's name: ``node.name`` when configured (written here when ``remember``
        and it is new), else the remembered one, else the default (``vm-kx3q``).

        Raises:
            ConfigError: the file cannot be read or written (it names the file).
        """
        configured = node.name.strip()
        if not configured:
            return self.read() or node.display_name(node_id)
        if remember and configured != self.read():
            tmp = self.path.with_suffix(".tmp")
            try:
                tmp.write_text(configured + "\n", encoding="utf-8")
                tmp.replace(self.path)  # atomically: a reader never sees half a name
            except OSError as exc:
                raise ConfigError(
                    f"cannot write the node's name to {self.path}: {exc.strerror}"
                ) from exc
        return configured
