"""Configuration (spec §9): a TOML file, overridden by ``HEARTHNET_<SECTION>_<KEY>``
environment variables, overridden by command-line flags.

Every key lives in one section dataclass below with its default and a one-line doc;
``docs/configuration.md`` lists them all (a test keeps the two in step), and
``hearthnet config show`` prints the effective values. [mesh] is in
:mod:`hearthnet.config.mesh_section`; loading in :mod:`hearthnet.config.loading`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hearthnet.ids import short_id

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


def _doc(text: str, *, choices: tuple[str, ...] = (), positive: bool = False) -> dict[str, object]:
    """A key's metadata: its text for the docs table, the values a string key takes (none:
    any) and, for how often something runs (``positive``), that it must be more than 0
    (a loop every 0 s would take a whole core). Checked when the configuration loads;
    no number may be negative."""
    return {"doc": text, "choices": choices, "positive": positive}


def data_dir_from_environment() -> str | None:
    """``$HEARTHNET_NODE_DATA_DIR`` or its short form ``$HEARTHNET_DATA_DIR``, if set (it
    then outranks a configuration file's)."""
    return os.environ.get("HEARTHNET_NODE_DATA_DIR") or os.environ.get("HEARTHNET_DATA_DIR")


def default_data_dir() -> Path:
    """The environment's data dir (:func:`data_dir_from_environment`), else
    ``~/.local/share/hearthnet`` (spec §1.2)."""
    env = data_dir_from_environment()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".local" / "share" / "hearthnet"


def default_node_name(host: str, node_id: str) -> str:
    """``<host>-<first 4 characters of the short id>``, lower case (``vm-kx3q``): readable,
    and unique enough to tell apart nodes whose hosts share a name. The host's first DNS
    label only (``vm`` for ``vm.example.org``)."""
    label = host.split(".", 1)[0].strip() or "node"
    return f"{label}-{short_id(node_id)[:4].lower()}"


@dataclass(frozen=True, slots=True)
class NodeSection:
    """[node]: who this node is and where it listens."""

    name: str = field(
        default="",
        metadata=_doc(
            "Human name of this node, shown to peers and in zeroconf; remembered in "
            "`<data_dir>/name`, so a later start given none keeps it. Empty: the name given "
            "last, else the host name and the start of the node's short id (`vm-kx3q`), so "
            "that nodes on hosts of the same name stay apart."
        ),
    )
    host: str = field(default="0.0.0.0", metadata=_doc("Address to listen on."))  # noqa: S104
    port: int = field(
        default=7080, metadata=_doc("TCP port for HTTP, SSE and WebSocket; 0 picks a free port.")
    )
    data_dir: str = field(
        default="",
        metadata=_doc(
            "Keys, log, heartbeats and run files (--data-dir). Empty: $HEARTHNET_DATA_DIR "
            "or ~/.local/share/hearthnet. Read from the file given with --config, not from "
            "<data_dir>/hearthnet.toml, which is found through the data dir."
        ),
    )
    log_level: str = field(
        default="info",
        metadata=_doc(
            "debug, info, warning or error.", choices=("debug", "info", "warning", "error")
        ),
    )
    tls: str = field(
        default="auto",
        metadata=_doc(
            "TLS for peer links: auto (between hosts; plain on loopback), on (always) or off. "
            "The port serves TLS and plain HTTP side by side; certificates carry the node's key.",
            choices=("auto", "on", "off"),
        ),
    )
    shutdown_grace_s: float = field(
        default=2.0,
        metadata=_doc("On SIGINT/SIGTERM, time given to streams to end before they are cancelled."),
    )

    def display_name(self, node_id: str) -> str:
        """The configured name, or the default: host name and short id (``vm-kx3q``)."""
        return self.name or default_node_name(socket.gethostname(), node_id)


@dataclass(frozen=True, slots=True)
class TransportSection:
    """[transport]: HTTP, SSE and WebSocket limits and timers (spec §2.5, §3.6)."""

    max_body_bytes: int = field(default=1 * MIB, metadata=_doc("Largest HTTP request body."))
    max_header_bytes: int = field(
        default=16 * KIB,
        metadata=_doc("Largest total size of request headers; over it: 431 payload_too_large."),
    )
    max_headers: int = field(
        default=128, metadata=_doc("Most request header lines; over it: 431 payload_too_large.")
    )
    head_timeout_s: float = field(
        default=10.0,
        metadata=_doc("Time from accept to a complete request head; else the connection closes."),
    )
    body_grace_s: float = field(
        default=10.0,
        metadata=_doc("Time after the head before body_min_bytes_per_s is enforced."),
    )
    body_min_bytes_per_s: int = field(
        default=1 * KIB,
        metadata=_doc(
            "Least average pace of a first request's body (after body_grace_s); slower closes."
        ),
    )
    preauth_per_source: int = field(
        default=256,
        metadata=_doc(
            "Connections one source address may hold before its first request is complete."
        ),
    )
    fd_reserve: int = field(
        default=0,
        metadata=_doc(
            "File descriptors that unauthenticated connections never take; "
            "0: a tenth of RLIMIT_NOFILE, at least 16."
        ),
    )
    keepalive_idle_s: float = field(
        default=15.0, metadata=_doc("An idle kept-alive HTTP connection closes after this long.")
    )
    max_ws_message_bytes: int = field(
        default=1 * MIB,
        metadata=_doc("Largest WebSocket message; larger ones close the socket with 1009."),
    )
    ws_ping_s: float = field(
        default=30.0,
        metadata=_doc(
            "Interval between WebSocket pings (presence members: half of "
            "pubsub.presence_silence_s when that is shorter).",
            positive=True,
        ),
    )
    ws_missed_pongs: int = field(
        default=2, metadata=_doc("Pongs a peer may miss before the socket is closed with 4408.")
    )
    ws_idle_s: float = field(
        default=120.0, metadata=_doc("No data frames either way for this long: close with 1000.")
    )
    ws_first_frame_s: float = field(
        default=10.0,
        metadata=_doc("Time a client has to send its first (call or auth) frame; else close 1008."),
    )
    stream_window: int = field(
        default=16, metadata=_doc("Unacknowledged frames in flight on a bus stream.")
    )
    stream_ack_timeout_s: float = field(
        default=5.0,
        metadata=_doc("A bus stream blocked this long without an ack ends with error timeout."),
    )
    sse_keepalive_s: float = field(
        default=15.0, metadata=_doc("Interval of ': keepalive' SSE comments.", positive=True)
    )
    websocket_enabled: bool = field(
        default=True,
        metadata=_doc(
            "Accept WebSocket upgrades; when false, upgrades get 503 and clients fall back to SSE."
        ),
    )


@dataclass(frozen=True, slots=True)
class SecuritySection:
    """[security]: signature windows and replay protection (spec §1.4)."""

    clock_window_s: float = field(
        default=60.0,
        metadata=_doc("Largest allowed distance between a request's ts and our clock."),
    )
    replay_window_s: float = field(
        default=120.0, metadata=_doc("How long a (from, request_id) pair is remembered.")
    )
    replay_cache_max: int = field(
        default=1_000_000,
        metadata=_doc(
            "Most remembered request ids; when full of live ids, new signed calls get unavailable."
        ),
    )
    rotation_grace_s: float = field(
        default=30.0,
        metadata=_doc(
            "After a topic key rotation, how long live sessions on a voided token have to "
            "re-authenticate with a fresh one before they are closed."
        ),
    )
    allowed_origins: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "Web pages (origins like https://app.example:8443) that may use the node from a "
            "browser: fetch, EventSource and WebSocket. The node's own origin always may; "
            'requests from other origins are refused (forbidden). "*" allows any origin.'
        ),
    )
    allowed_hosts: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "Host names (like hearth.example.org) the node is reached by in a browser, "
            "besides IP addresses, localhost, the machine's host name (and NAME.local) and "
            "the host of mesh.advertise_url: the node's own origin is believed only for "
            "these, so a DNS-rebound name is refused. Add the name a reverse proxy serves "
            "the node under."
        ),
    )


@dataclass(frozen=True, slots=True)
class LimitsSection:
    """[limits]: rate and connection limits (spec §2.5)."""

    calls_per_s_per_capability: float = field(
        default=100.0, metadata=_doc("Calls per second one caller may make to one capability.")
    )
    calls_per_s_total: float = field(
        default=1000.0, metadata=_doc("Calls per second one caller may make in all.")
    )
    connections_per_identity: int = field(
        default=100, metadata=_doc("Open streams and sockets per identity.")
    )
    connections_total: int = field(
        default=10_000, metadata=_doc("Open streams and sockets per node.")
    )
    rate_limit_callers_max: int = field(
        default=100_000,
        metadata=_doc(
            "Callers whose rate budgets are tracked at once (least recently seen are forgotten)."
        ),
    )


@dataclass(frozen=True, slots=True)
class BusSection:
    """[bus]: capability call defaults (spec §2.3). A call without
    X-HearthNet-Deadline-Ms gets its capability's ``timeout_s`` (30 s; 120 s for llm.*)."""

    max_deadline_s: float = field(
        default=3600.0, metadata=_doc("Largest deadline a caller may ask for.")
    )


@dataclass(frozen=True, slots=True)
class PubSubSection:
    """[pubsub]: the log, delivery, limits and rules (spec §6, §2.5)."""

    sync: str = field(
        default="full",
        metadata=_doc(
            "SQLite synchronous mode: full (a publish survives a power cut once acknowledged) or "
            "normal (survives a crash of the node only).",
            choices=("full", "normal"),
        ),
    )
    max_payload_bytes: int = field(
        default=256 * KIB,
        metadata=_doc("Largest message data: its JSON bytes, or its raw bytes when it is bytes."),
    )
    max_batch: int = field(default=1024, metadata=_doc("Most messages written in one commit."))
    max_pending: int = field(
        default=16_384,
        metadata=_doc(
            "Publishes (and peers' messages) waiting for the log's next commits; past it a "
            "publish is refused with unavailable (503, retry_after_ms), and a peer's message "
            "is left for anti-entropy."
        ),
    )
    queue_max: int = field(
        default=1024,
        metadata=_doc(
            "Messages queued per subscriber before the oldest are dropped with a gap frame."
        ),
    )
    default_window: int = field(
        default=1024,
        metadata=_doc(
            "Unacknowledged message frames per WebSocket session, unless its auth frame "
            "says otherwise."
        ),
    )
    max_messages_per_topic: int = field(
        default=1000,
        metadata=_doc(
            "Retention: messages kept per topic (unless a [[pubsub.retention]] rule matches)."
        ),
    )
    max_age_s: float = field(
        default=86400.0,
        metadata=_doc("Retention: age after which messages go (unless a rule matches)."),
    )
    max_bytes: int = field(
        default=1 * GIB,
        metadata=_doc("Retention: the whole log's size cap; the oldest messages go first."),
    )
    max_messages: int = field(
        default=1_000_000,
        metadata=_doc(
            "Retention: the whole log's message cap (~180 bytes of RAM each for its indexes);"
            " the oldest messages go first."
        ),
    )
    retention_interval_s: float = field(
        default=10.0,
        metadata=_doc(
            "How often retention runs (and, at most, how often passes started by the"
            " message cap look for old and expired messages).",
            positive=True,
        ),
    )
    publish_per_s_member: float = field(
        default=1000.0, metadata=_doc("Publishes per second per member.")
    )
    publish_per_s_token: float = field(
        default=100.0, metadata=_doc("Publishes per second per token client.")
    )
    idempotency_window_s: float = field(
        default=120.0,
        metadata=_doc(
            "How long after its commit a publish's idempotency_key is remembered: a publish"
            " with the same key (same publisher) gets the first answer, marked duplicate,"
            " and is not published again. In memory: a restart forgets it."
        ),
    )
    idempotency_max_keys: int = field(
        default=100_000,
        metadata=_doc(
            "Idempotency keys remembered on this node, all publishers together (~300 bytes"
            " each); when full, the oldest go first (0: none past their commit)."
        ),
    )
    presence_silence_s: float = field(
        default=30.0,
        metadata=_doc("A subscriber silent this long (no frame, no pong) leaves presence."),
    )
    long_poll_max_s: float = field(
        default=60.0, metadata=_doc("Longest long-poll wait (timeout_s).")
    )
    max_patterns_per_session: int = field(
        default=256, metadata=_doc("Subscribed patterns per session.")
    )
    max_pending_per_session: int = field(
        default=64,
        metadata=_doc(
            "Subscribe/unsubscribe requests one WebSocket session may have in progress "
            "at once; more are refused with capacity_exceeded."
        ),
    )
    consumer_max_held: int = field(
        default=10_000,
        metadata=_doc(
            "Unacknowledged messages kept per durable consumer past normal retention (its"
            " next matches after its cursor; a message past its `ttl_s` is not kept)."
        ),
    )
    consumer_max_age_s: float = field(
        default=7 * 86400.0,
        metadata=_doc("How long unacknowledged messages are kept for a durable consumer."),
    )
    max_consumers_per_identity: int = field(
        default=100,
        metadata=_doc(
            "Durable consumers one identity (a member, or a token's issuer/sub) may have;"
            " a subscribe that would make one more is refused with capacity_exceeded"
            " (0: none)."
        ),
    )
    max_consumers: int = field(
        default=10_000,
        metadata=_doc("Durable consumers on this node, all identities together."),
    )
    rules: tuple[dict[str, Any], ...] = field(
        default=(),
        metadata=_doc(
            "Access rules, [[pubsub.rules]] tables {pattern, subscribe, publish}; "
            "empty: the defaults in docs/pubsub.md. Ignored while the community has signed "
            "rules (hearthnet community rules)."
        ),
    )
    retention: tuple[dict[str, Any], ...] = field(
        default=(),
        metadata=_doc(
            "Retention rules, [[pubsub.retention]] tables {pattern, max_messages, max_age_s}."
        ),
    )


@dataclass(frozen=True, slots=True)
class LlmSection:
    """[llm]: the ``llm.chat@2.0`` capability and its tool loop (spec §5). The capability is
    offered only when ``url`` is set or ``demo`` is true."""

    url: str = field(
        default="",
        metadata=_doc(
            "OpenAI-compatible API base URL (Ollama http://127.0.0.1:11434/v1, llama.cpp "
            "server http://127.0.0.1:8080/v1, vLLM http://127.0.0.1:8000/v1); empty: none."
        ),
    )
    model: str = field(
        default="", metadata=_doc("Model name sent to the model server (a call may override it).")
    )
    api_key_env: str = field(
        default="HEARTHNET_LLM_API_KEY",
        metadata=_doc(
            "Environment variable holding the model server's API key (sent as a Bearer "
            "token); unset or empty: no key is sent."
        ),
    )
    demo: bool = field(
        default=False,
        metadata=_doc("Offer the deterministic demo model (no model server needed)."),
    )
    demo_script: str = field(
        default="",
        metadata=_doc("JSON file with a script for the demo model; empty: its built-in behaviour."),
    )
    timeout_s: float = field(
        default=120.0,
        metadata=_doc("Deadline of an llm.chat call without X-HearthNet-Deadline-Ms."),
    )
    request_timeout_s: float = field(
        default=60.0,
        metadata=_doc("Longest silence from the model server within one model turn."),
    )
    tool_timeout_s: float = field(
        default=30.0,
        metadata=_doc("Time a caller has to send one tool result; then the model gets an error."),
    )
    max_rounds: int = field(
        default=6, metadata=_doc("Tool rounds per answer; then the model must answer without.")
    )
    max_parallel_tools: int = field(
        default=4, metadata=_doc("Tool calls a caller is asked to run at the same time.")
    )
    max_tools: int = field(default=16, metadata=_doc("Tools one call may offer the model."))
    max_calls_per_turn: int = field(
        default=16,
        metadata=_doc("Tool calls kept from one model turn; further ones are dropped and counted."),
    )
    max_tokens: int = field(
        default=4096,
        metadata=_doc("Largest max_tokens of one model turn; also the default when none is asked."),
    )
    max_messages: int = field(default=512, metadata=_doc("Messages one call may carry."))
    max_concurrent: int = field(default=8, metadata=_doc("llm.chat calls running at once."))
