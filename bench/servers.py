"""Reference pub/sub servers for the fan-out benchmark: nats-server (core, and with
JetStream on file storage) and Mosquitto from Debian, each started on free loopback ports
with its own config in a temp dir, and stopped by PID.

Neither is run as a system service: if a package started one, it is left alone (and
reported); ours listen on ports picked here.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.common import stop_process


class MissingTool(RuntimeError):
    """A server binary the benchmark needs is not installed."""


INSTALL_HINTS = {
    "nats-server": "apt-get install -y nats-server",
    "mosquitto": "apt-get install -y mosquitto",
    "node": "install Node.js 20+ (apt-get install -y nodejs npm), then `npm ci` in bench/fanout",
}


def require(tool: str) -> str:
    """The path of ``tool``, or a clear error saying how to install it."""
    path = shutil.which(tool) or next(
        (p for p in (f"/usr/sbin/{tool}", f"/usr/local/sbin/{tool}") if Path(p).exists()), None
    )
    if path is None:
        raise MissingTool(f"{tool} not found; install it: {INSTALL_HINTS.get(tool, tool)}")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """Wait until something accepts on 127.0.0.1:port (or the process dies)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout_s} s")


@dataclass
class RefServer:
    """A reference server process we started."""

    name: str
    proc: subprocess.Popen[bytes]
    ws_url: str
    workdir: Path
    version: str
    log: IO[bytes] | None = None
    port: int = 0  # the plain client port, where there is one

    @property
    def pid(self) -> int:
        """The server's PID."""
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; remove the temp dir."""
        stop_process(self.proc)
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _version(cmd: list[str]) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5, check=False)
        text = (out.stdout or out.stderr).strip().splitlines()
        return text[0] if text else "?"
    return "?"


def start_nats() -> RefServer:
    """nats-server with a WebSocket listener (no TLS, no compression) on loopback."""
    binary = require("nats-server")
    work = Path(tempfile.mkdtemp(prefix="bench-nats-"))
    port, ws_port = free_port(), free_port()
    (work / "nats.conf").write_text(
        f'listen: "127.0.0.1:{port}"\n'
        f"websocket {{\n"
        f'  listen: "127.0.0.1:{ws_port}"\n'
        f"  no_tls: true\n"
        f"  compression: false\n"
        f"}}\n",
        encoding="ascii",
    )
    return _launch("nats", binary, work / "nats.conf", ws_port, _version([binary, "--version"]))


# The stream every JetStream run publishes into: file storage, subjects bench.>, the
# node's default retention (1,000 messages per topic; the node keeps 1,000 per topic and
# 1 GiB in all), one replica.
JETSTREAM_STREAM = "BENCH"
JETSTREAM_CONFIG = {
    "name": JETSTREAM_STREAM,
    "subjects": ["bench.>"],
    "storage": "file",
    "retention": "limits",
    "discard": "old",
    "max_msgs_per_subject": 1000,
    "max_bytes": 1 << 30,
    "num_replicas": 1,
}
# When JetStream fsyncs. By default (every version) it acknowledges a publish once the
# message is written to its block file (`write()`, no fsync; the stream's file store
# flushes in place) and fsyncs the files every 2 minutes, so a PubAck survives a crash of
# the server (kill -9) but not of the machine. nats-server 2.10.0 added
# `jetstream { sync_interval: always }` (an fsync before each PubAck); 2.9 (Debian 12's
# 2.9.10) has no such setting and refuses the field ("unknown field").
SYNC_ALWAYS_SINCE = (2, 10, 0)


def parse_version(text: str) -> tuple[int, int, int] | None:
    """The first ``x.y.z`` in ``text`` (``nats-server: v2.9.10``: (2, 9, 10)), or None."""
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if found is None:
        return None
    major, minor, patch = (int(x) for x in found.groups())
    return major, minor, patch


def sync_always_missing(version: tuple[int, int, int] | None) -> str | None:
    """Why a nats-server of ``version`` cannot fsync each JetStream publish, or None."""
    if version is not None and version >= SYNC_ALWAYS_SINCE:
        return None
    shown = ".".join(map(str, version)) if version else "of unknown version"
    return (
        f"nats-server {shown} cannot fsync each JetStream publish: `sync_interval: always` "
        f"came with 2.10.0 (before it, JetStream fsyncs every 2 minutes)"
    )


def jetstream_sync_missing(binary: str) -> str | None:
    """Why the nats-server at ``binary`` cannot fsync each JetStream publish, or None."""
    return sync_always_missing(parse_version(_version([binary, "--version"])))


def start_jetstream(*, sync_always: bool = False) -> RefServer:
    """nats-server with JetStream (file storage in the temp dir) and a WebSocket listener;
    the benchmark's stream is created before it is handed out. ``sync_always``: an fsync
    before each PubAck (nats-server 2.10+; :class:`MissingTool` on older ones)."""
    binary = require("nats-server")
    if sync_always and (missing := jetstream_sync_missing(binary)):
        raise MissingTool(missing)
    work = Path(tempfile.mkdtemp(prefix="bench-jetstream-"))
    port, ws_port = free_port(), free_port()
    (work / "nats.conf").write_text(
        f'listen: "127.0.0.1:{port}"\n'
        f"jetstream {{\n"
        f'  store_dir: "{work / "store"}"\n'
        f"  max_file_store: 4GB\n"
        f"  max_memory_store: 256MB\n"
        + ("  sync_interval: always\n" if sync_always else "")
        + "}\n"
        f"websocket {{\n"
        f'  listen: "127.0.0.1:{ws_port}"\n'
        f"  no_tls: true\n"
        f"  compression: false\n"
        f"}}\n",
        encoding="ascii",
    )
    sync = "fsync per publish" if sync_always else "fsync every 2 min"
    version = _version([binary, "--version"]) + f" (JetStream, file storage, {sync})"
    name = "jetstream-sync" if sync_always else "jetstream"
    server = _launch(name, binary, work / "nats.conf", ws_port, version)
    server.port = port
    try:
        reply = nats_request(port, f"$JS.API.STREAM.CREATE.{JETSTREAM_STREAM}", JETSTREAM_CONFIG)
        if "error" in reply:
            raise RuntimeError(f"JetStream stream create: {reply['error']}")
    except Exception:
        server.stop()
        raise
    return server


def nats_request(port: int, subject: str, body: dict[str, Any], timeout_s: float = 10.0) -> Any:
    """One request over NATS's plain protocol on 127.0.0.1:port: the JSON reply."""
    payload = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout_s) as sock:
        reader = sock.makefile("rb")
        if not reader.readline().startswith(b"INFO "):
            raise RuntimeError("nats-server did not send INFO")
        sock.sendall(
            b'CONNECT {"verbose":false,"pedantic":false,"protocol":1}\r\n'
            b"SUB _INBOX.bench 1\r\n"
            + f"PUB {subject} _INBOX.bench {len(payload)}\r\n".encode()
            + payload
            + b"\r\n"
        )
        for _ in range(100):  # bounded: INFO updates, PINGs, then the reply
            line = reader.readline()
            if not line:
                break
            if line.startswith(b"PING"):
                sock.sendall(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise RuntimeError(line.decode(errors="replace").strip())
            elif line.startswith(b"MSG "):
                size = int(line.split()[-1])
                return json.loads(reader.read(size + 2)[:size])
        raise RuntimeError(f"no reply to {subject}")


def start_mosquitto() -> RefServer:
    """Mosquitto with a websockets listener on loopback.

    Mosquitto 2.0.11 (Debian 12) refuses to start when its only listener is a websockets
    one ("Unable to start any listening sockets"), so a plain MQTT listener on another
    loopback port is configured too; the benchmark uses only the websockets one.
    """
    binary = require("mosquitto")
    work = Path(tempfile.mkdtemp(prefix="bench-mosquitto-"))
    work.chmod(0o755)  # mosquitto drops to its own user when started as root
    port, ws_port = free_port(), free_port()
    (work / "mosquitto.conf").write_text(
        f"listener {port} 127.0.0.1\n"
        f"listener {ws_port} 127.0.0.1\n"
        "protocol websockets\n"
        "allow_anonymous true\n"
        "persistence false\n"
        "max_connections -1\n"
        "log_dest stderr\n"
        "log_type error\n"
        "log_type warning\n",
        encoding="ascii",
    )
    return _launch("mosquitto", binary, work / "mosquitto.conf", ws_port, _version([binary, "-h"]))


def _launch(name: str, binary: str, conf: Path, ws_port: int, version: str) -> RefServer:
    """Start ``binary -c conf`` (log beside the config) and wait for its WebSocket port."""
    log = (conf.parent / "server.log").open("wb")
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    server = RefServer(name, proc, f"ws://127.0.0.1:{ws_port}", conf.parent, version, log)
    try:
        wait_port(ws_port, proc)
    except Exception:
        server.stop()
        raise
    return server


def system_instances() -> list[str]:
    """nats-server or mosquitto processes we did not start (e.g., a package's service)."""
    found = []
    for name in ("nats-server", "mosquitto"):
        out = subprocess.run(
            ["pgrep", "-a", "-x", name], capture_output=True, text=True, check=False
        )
        found += [line for line in out.stdout.splitlines() if line.strip()]
    return found
