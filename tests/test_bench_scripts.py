"""The in-process benchmarks still run against the current log, at a tiny size.

Their numbers are quoted in docs/benchmarks.md and docs/benchmarks-log.md; these checks
only keep the scripts working as the code under them changes (a timing is never asserted).
Benchmarks that start node processes (bench_relay) are only checked for ``--help`` and their
pure parts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import cbor2
import pytest

from bench import (
    bench_bus,
    bench_commit_latency,
    bench_fanout_cost,
    bench_js_verify,
    bench_log_parts,
    bench_publish_cost,
    bench_pubsub,
    bench_read_last,
    bench_relay,
    bench_relay_forward,
    bench_shared_writes,
    bench_switch_calls,
    bench_writer_trip,
    bench_ws_publish,
    lone_trace,
    pubsub_report,
    pubsub_targets,
    servers,
    spy,
)
from hearthnet.identity import KeyPair
from hearthnet.mesh.relay_frames import Route
from hearthnet.mesh.route_batch import encode_batch
from hearthnet.mesh.route_header import encode_route

ROOT = Path(__file__).resolve().parent.parent
NODE = KeyPair.from_seed(b"\x01" * 32).node_id


async def test_publish_cost_measures_every_publish_through_the_log() -> None:
    opts = argparse.Namespace(
        messages=120,
        batch=40,
        sync=["full", "normal"],
        modes=["gather", "ws", "many"],
        gc="default",
    )
    result = await bench_publish_cost.run(opts)
    assert [(r["sync"], r["mode"], r["messages"], r["batch"]) for r in result["log"]] == [
        (sync, mode, 120, 40) for sync in ("full", "normal") for mode in ("gather", "ws", "many")
    ]
    assert result["sign_cpu_us"] > 0
    assert result["envelope_cpu_us"] > 0
    assert all(r["cpu_us_per_message"] > 0 for r in result["log"])
    # 256 bytes as CBOR bytes travel in smaller frames than their base64 text in JSON
    # (publish and delivered frames alike), which data_enc makes a little larger
    for key in ("publish_frame_bytes", "message_frame_bytes"):
        sizes = [result["binary"][n][key] for n in ("cbor_bytes", "json_base64", "json_data_enc")]
        assert sizes[0] < sizes[1] < sizes[2], (key, sizes)


@pytest.mark.parametrize("sink", ["socket", "tcp"])
async def test_fanout_cost_delivers_every_batch_to_every_subscriber(sink: str) -> None:
    """bench_fanout_cost: each timed round reaches every subscriber's socket (a Unix
    socket pair or loopback TCP) alike, and both ways of reading an ack are timed."""
    took, received = await bench_fanout_cost.fanout_batch_s(3, 4, 2, sink)
    acks = bench_fanout_cost.ack_costs(5)
    assert (2, 3, 1) == (len(took), len(received), len(set(received)))
    assert received[0] > 2 * 4 * 256
    assert all(v is not None and v > 0 for v in acks.values())


async def test_fanout_cost_lean_frames_are_fewer_bytes() -> None:
    """bench_fanout_cost --fields: subscribers asking for data alone receive fewer bytes."""
    _, full = await bench_fanout_cost.fanout_batch_s(2, 4, 2, "socket")
    _, lean = await bench_fanout_cost.fanout_batch_s(2, 4, 2, "socket", fields="data")
    assert (True, True) == (lean[0] < full[0], lean[0] > 2 * 4 * 256)


async def test_shared_writes_times_both_ways_for_every_size() -> None:
    """bench_shared_writes: plain writes and sends from a shared file, one row per size."""
    rows = await bench_shared_writes.measure(3, [1000, 50_000], 4)
    assert [(3, 1000, True, True), (3, 50_000, True, True)] == [
        (r["subs"], r["bytes"], r["write_us_per_socket"] > 0, r["sendfile_us_per_socket"] > 0)
        for r in rows
    ]


async def test_commit_latency_times_every_publish() -> None:
    """bench_commit_latency: every publish of a short run is timed, checkpoint off too."""
    row = await bench_commit_latency.one_run("NORMAL", 400, 0.05, checkpoint=False)
    assert ("off", True) == (row["checkpoint"], row["messages"] >= 2 and row["p50_ms"] > 0)


@pytest.mark.parametrize("keyed", [False, True])
async def test_ws_publish_answers_every_publish_of_both_forms(keyed: bool) -> None:
    """bench_ws_publish: every publish of a token client is answered published.ok, with
    an idempotency key of its own too (none is a duplicate)."""
    opts = argparse.Namespace(
        messages=96, batch=32, form="json,cbor", sync="normal", repeat=1, keyed=keyed
    )
    result = await bench_ws_publish.run(opts)
    assert [("json", 96, 0), ("cbor", 96, 0)] == [
        (r["form"], r["messages"], r["errors"]) for r in result["runs"]
    ]


async def test_writer_trip_times_both_hand_offs() -> None:
    """bench_writer_trip measures a trip through the log's writer and through a pool."""
    result = await bench_writer_trip.run(argparse.Namespace(trips=20, repeat=1))
    assert (20, 1, True) == (
        result["trips"],
        len(result["rounds"]),
        all(value > 0 for value in result["median"].values()),
    )


async def test_log_parts_times_the_writer_pieces_of_real_commits() -> None:
    """bench_log_parts times signing and SQLite inside real commits, and the pieces add
    up to the whole."""
    opts = argparse.Namespace(messages=120, batch=40, sync=["normal"], runs=1, mode="ws")
    result = await bench_log_parts.run(opts)
    parts = result["sync"]["normal"]["runs"][0]
    assert (True, True) == (
        parts["sign"] > 0 and parts["sqlite"] > 0,
        abs(
            parts["total"]
            - parts["event_loop_and_hand_over"]
            - parts["sign"]
            - parts["sqlite"]
            - parts["writer_rest"]
        )
        < 1e-6,
    )


@pytest.mark.skipif(shutil.which("node") is None, reason="no node (apt-get install nodejs)")
def test_js_verify_measures_both_checkers_on_the_same_envelopes() -> None:
    opts = argparse.Namespace(batches=2, batch=5, singles=3, name="unused")
    result = bench_js_verify.measure(opts)
    keys = {"batch_one_by_one_us", "batch_known_us", "single_us"}
    assert keys | {"batch_together_us"} == set(result["hearthnet_js"])
    assert keys == set(result["python"])


async def test_read_last_finds_the_newest_rooms() -> None:
    opts = argparse.Namespace(rooms=30, busy=500, last=[5, 30, 100], repeat=1)
    result = await bench_read_last.run(opts)
    assert result["log_messages"] == 530
    assert [r["rows"] for r in result["runs"]] == [5, 30, 30]


@pytest.mark.parametrize(
    ("module", "option"),
    [
        ("bench.bench_relay", "--quick"),
        ("bench.bench_punch", "--seconds"),
        ("bench.bench_linkread", "--frames"),
        ("bench.bench_relay_keepalive", "--idle-s"),
        ("bench.bench_start", "--starts"),
        ("bench.bench_topic_churn", "--per-round"),
    ],
)
def test_benches_run_by_hand_have_help(module: str, option: str) -> None:
    """bench_relay (many processes) and bench_punch (root and the NAT lab) run by hand,
    never as tests: ``--help`` works and names their budget option."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
    )
    assert option in out.stdout


def test_forward_floor_forwards_every_byte_in_each_mode() -> None:
    """The bare forwarder passes every byte A wrote on to B (the run waits for the last
    one and fails past --max-s), and a figure comes out for each mode."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.bench_forward_floor",
            "--frames",
            "400",
            "--repeat",
            "1",
            "--modes",
            "1@4000,8",
            "--max-s",
            "20",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
    )
    assert ["1@4000:", "8:"] == [
        line.split()[0] for line in out.stdout.splitlines() if "µs a frame" in line
    ]


def test_relay_core_cost_is_measured_on_frames_it_forwards() -> None:
    result = bench_relay.core_frame_us(300)
    assert (result["frames"], result["forwarded"]) == (300, 300)
    assert result["us_per_frame"] > 0


def test_relay_forward_counts_the_frames_of_a_batch_by_their_headers() -> None:
    frames = [encode_route(Route(NODE, NODE, 4, i, b"x" * i)) for i in range(3)]
    assert [1, 3] == [
        bench_relay_forward._frames_in(frames[0]),
        bench_relay_forward._frames_in(encode_batch(frames)),
    ]


def test_relay_batch_cost_is_measured_on_frames_it_forwards() -> None:
    result = bench_relay.core_batch_us(64)
    assert result is not None
    assert (64, 64, 8) == (result["frames"], result["forwarded"], result["per_batch"])


def test_relay_ratios_compare_the_relayed_path_with_the_direct_link() -> None:
    def side(p50: float, calls: float, deliveries: float) -> dict[str, Any]:
        c = {"p50_ms": p50, "calls_per_s": calls}
        return {"c1": c, "c16": c, "fanout": {"deliveries_per_s": deliveries}}

    got = bench_relay.ratios(side(1.0, 1000, 5000), side(1.5, 800, 4500))
    assert (got["c1_p50_added_ms"], got["c16_calls_per_s_ratio"], got["fanout_ratio"]) == (
        0.5,
        0.8,
        0.9,
    )


def test_pubsub_help_names_the_durable_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    """bench_pubsub (reference servers and Node.js) runs by hand: its ``--help`` works."""
    with pytest.raises(SystemExit):
        bench_pubsub.parse_args(["--help"])
    assert "--durable-outstanding" in capsys.readouterr().out


def test_pubsub_scenarios_include_the_durable_runs_against_jetstream() -> None:
    """The durable 1->1 scenario runs once per in-flight count, HearthNet against JetStream."""
    opts = bench_pubsub.parse_args(["--quick", "--skip", "throughput,latency"])
    got = [
        (key, sc.outstanding, sc.servers[-1], bench_pubsub.REFERENCE[sc.mode])
        for key, sc in bench_pubsub.fanout_scenarios(opts, {"throughput", "latency"})
    ]
    assert got == [
        ("durable 1→1, 1 in flight", 1, "jetstream", "jetstream"),
        ("durable 1→1, 256 in flight", 256, "jetstream", "jetstream"),
    ]


def test_pubsub_ratios_are_taken_within_each_round() -> None:
    """A server's ratio to the peer is computed per round, then the median is taken."""

    def run(rate: float, cpu: float) -> dict[str, Any]:
        return {"deliveries_per_s": rate, "server_cpu_us_per_delivery": cpu, "latency_ms": {}}

    rounds = [
        {"hearthnet": run(100, 2.0), "nats": run(200, 1.0)},
        {"hearthnet": run(300, 1.0), "nats": run(200, 1.0)},
        {"hearthnet": run(150, 1.0)},
    ]
    got = pubsub_report.round_ratios(rounds, "nats")["hearthnet"]
    assert (got["rate_per_round"], got["rate_median"], got["cpu_median"]) == (
        [0.5, 1.5],
        1.0,
        1.5,
    )


def test_durable_runs_are_compared_with_the_server_that_promises_the_same() -> None:
    """`full` is paired with JetStream fsyncing each publish, `normal` with JetStream's
    default; the ratios are taken within each round, and the table says what each ack
    promises (and `–` where the peer did not run)."""

    def run(rate: float, cpu: float) -> dict[str, Any]:
        return {
            "deliveries_per_s": rate,
            "server_cpu_us_per_delivery": cpu,
            "latency_ms": {},
            "publish_ack_ms": {"50": 1e3 / rate / 2, "99": 1e3 / rate * 4},  # ms
        }

    rounds = [
        {"hearthnet": run(a, b), "hearthnet-normal": run(c, d), "jetstream": run(e, f)}
        for a, b, c, d, e, f in ((400, 600.0, 1000, 300.0, 2000, 150.0),
                                 (500, 500.0, 1500, 200.0, 2500, 200.0))
    ]  # fmt: skip
    pairs = pubsub_report.like_for_like(rounds, pubsub_targets.LIKE_FOR_LIKE)
    assert pairs["hearthnet-normal"] == {
        "peer": "jetstream",
        "rate_per_round": [0.5, 0.6],
        "rate_median": 0.55,
        "cpu_per_round": [2.0, 1.0],
        "cpu_median": 1.5,
        "ack_p50_per_round": [2.0, 1.667],
        "ack_p50_median": 1.8335,
    }
    assert pairs["hearthnet"]["peer"] == "jetstream-sync"
    assert pairs["hearthnet"]["rate_median"] is None  # its peer did not run
    scenario = {
        "scenario": {"mode": "durable"},
        "runs": {name: [rounds[0][name]] for name in rounds[0]},
        "median_run": {name: 0 for name in rounds[0]},
        "like_for_like": pairs,
    }
    result = {
        "fanout": {"durable 1→1, 1 in flight": scenario},
        "durability": {n: pubsub_targets.DURABILITY[n] for n in rounds[0]},
    }
    rows = {line.split(" | ")[1]: line for line in pubsub_report.durability_table(result)[3:]}
    assert (
        "fsync before each ack: survives a power cut | jetstream-sync | 400 | – | – "
        "| 1.250 / 10.000 | – |" in rows["hearthnet"]
    )
    assert (
        "survives kill -9, not a power cut | jetstream | 1,000 | 0.55× | 1.50× "
        "| 0.500 / 4.000 | 1.83× |" in rows["hearthnet-normal"]
    )


def test_jetstream_sync_always_needs_nats_server_2_10(tmp_path: Path) -> None:
    """The installed nats-server refuses `sync_interval` exactly when the benchmark says it
    cannot fsync each publish (before 2.10.0), and accepts it from 2.10 on."""
    assert servers.sync_always_missing((2, 10, 0)) is None
    assert "2.9.10" in (servers.sync_always_missing((2, 9, 10)) or "")
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    if not Path(binary).exists():
        pytest.skip("nats-server is not installed")
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f'listen: "127.0.0.1:{servers.free_port()}"\n'
        f'jetstream {{\n  store_dir: "{tmp_path / "store"}"\n  sync_interval: always\n}}\n',
        encoding="ascii",
    )
    checked = subprocess.run(
        [binary, "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30, check=False
    )
    missing = servers.jetstream_sync_missing(binary)
    assert (checked.returncode != 0) == (missing is not None), checked.stderr
    if missing is not None:
        assert "sync_interval" in checked.stderr


def test_load_generator_cbor_matches_the_nodes_codec() -> None:
    """bench/fanout/cbor.mjs encodes what cbor2 decodes, and decodes what cbor2 encodes."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed (.ci/run installs it)")
    frame = {"type": "auth", "ts": 1764160000000, "n": -5, "f": 1.5, "a": [1, "é", None, True]}
    from_node = {"event": "gap", "data": {"from_seq": 70000, "to_seq": 1 << 33}, "x": 0.25}
    script = (
        "import('./bench/fanout/cbor.mjs').then((m) => process.stdout.write(JSON.stringify({"
        f"enc: m.encode({json.dumps(frame)}).toString('hex'), "
        f"dec: m.decode(Buffer.from('{cbor2.dumps(from_node).hex()}', 'hex'))}})))"
    )
    out = subprocess.run(
        [node, "-e", script], capture_output=True, text=True, check=True, timeout=30, cwd=ROOT
    )
    got = json.loads(out.stdout)
    assert (cbor2.loads(bytes.fromhex(got["enc"])), got["dec"]) == (frame, from_node)


class _Wire:
    """What an asyncio transport is to the raw stream client: bytes written, closed."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        """Keep the bytes."""
        self.written.append(data)

    def close(self) -> None:
        """Note the close."""
        self.closed = True


async def test_raw_stream_client_splits_frames_across_reads_and_acks_every_8() -> None:
    """bench_bus's lean stream client counts tokens split at any byte, sends its call
    after the 101, acks seq 8 and 16 (masked, zero key) and ends on done."""
    client = bench_bus.RawStreamClient(b'{"type":"call"}', cbor=False)
    wire = _Wire()
    client.connection_made(wire)  # type: ignore[arg-type]
    frames = [b'{"event":"token","data":{"i":%d},"seq":%d}' % (i, i) for i in range(1, 17)] + [
        b'{"event":"done","data":{},"seq":17}'
    ]
    stream = b"HTTP/1.1 101 Switching Protocols\r\n\r\n" + b"".join(
        bytes((0x81, len(f))) + f for f in frames
    )
    for at in range(0, len(stream), 7):
        client.data_received(stream[at : at + 7])
    acks = [w[6:] for w in wire.written[1:]]
    assert (
        16,
        None,
        True,
        b'{"type":"call"}',
        [b'{"type":"ack","upto":8}', b'{"type":"ack","upto":16}'],
        True,
    ) == (
        client.received,
        client.error,
        client.done.done(),
        wire.written[0][6:],
        acks,
        wire.closed,
    )


async def test_raw_call_client_splits_answers_across_reads_and_sends_the_next() -> None:
    """bench_bus's lean call client reads answers split at any byte, one request at a time."""
    latencies: list[float] = []
    client = bench_bus.RawCallClient([b"one", b"two", b"three"], latencies, float("inf"))
    wire = _Wire()
    client.connection_made(wire)  # type: ignore[arg-type]
    answers = (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 3\r\n\r\n{ }",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    )
    for answer in answers:
        for at in range(0, len(answer), 5):
            client.data_received(answer[at : at + 5])
    assert ([b"one", b"two", b"three"], 3, 1, True) == (
        wire.written,
        len(latencies),
        client.errors,
        client.done.done(),
    )


def test_spy_shares_count_idle_top_and_each_groups_own_samples(tmp_path: Path) -> None:
    """bench/spy.py reads py-spy's raw stacks: idle, top leaves, a group's own samples."""
    raw = tmp_path / "node.txt"
    raw.write_text(
        "main (hearthnet/cli.py:1);Runner.run (asyncio/runners.py:118) 6\n"
        "main (hearthnet/cli.py:1);unwrap (hearthnet/mesh/relayed_paths.py:9);"
        "mac (hearthnet/mesh/relay_e2e.py:7);blake2b (hashlib.py:1) 3\n"
        "main (hearthnet/cli.py:1);unwrap (hearthnet/mesh/relayed_paths.py:9);"
        "serve (hearthnet/mesh/remote.py:4) 1\n"
    )
    got = spy.shares(raw, {"path": ("mesh/relay_e2e.py", "mesh/relayed_paths.py")}, top=1)
    assert {
        "samples": 10,
        "idle_share": 0.6,
        "top": {"Runner.run (asyncio/runners.py:118)": 0.6},
        "groups": {"path": 0.3},
    } == got


def test_lone_trace_splits_round_trips_at_the_answer_and_the_next_read() -> None:
    """bench/lone_trace.py: a round trip runs from a read to the next read after its
    writes; the first write is the answer, the second the delivery; a frame split over
    two reads stays one round trip."""
    events = [
        ("rx0", 0), ("rx0", 10), ("wt1", 100), ("wt1", 130), ("fl1", 150),
        ("rx0", 200), ("wt1", 260), ("wt1", 300), ("fl1", 310),
        ("rx0", 400),
    ]  # fmt: skip
    got = [
        (c["rx"], c["ack"], c.get("dl"), c.get("fl"), c["next"]) for c in lone_trace.cycles(events)
    ]
    assert [(0, 100, 130, 150, 200), (200, 260, 300, 310, 400)] == got


def test_lone_trace_times_a_real_logs_lone_publishes(tmp_path: Path) -> None:
    """Installed in a process (as its sitecustomize does in a node), the trace times
    each lone publish's commit job and writes what it gathered at exit."""
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from bench.lone_trace import install\n"
        "install(Path(sys.argv[1]))\n"
        "from hearthnet.identity import KeyPair\n"
        "from hearthnet.pubsub.log import MessageLog\n"
        "async def main():\n"
        "    log = MessageLog(Path(sys.argv[2]), KeyPair.generate(), synchronous='normal')\n"
        "    await log.open()\n"
        "    for i in range(5):\n"
        "        done = asyncio.get_running_loop().create_future()\n"
        "        log.publish_many([('t.a', 'm', i, None, None)], answer=done.set_result)\n"
        "        await done\n"
        "    await log.close()\n"
        "asyncio.run(main())\n"
    )
    out = tmp_path / "trace"
    subprocess.run(
        [sys.executable, "-c", script, str(out), str(tmp_path / "log.db")],
        check=True,
        timeout=60,
        cwd=ROOT,
    )
    got = lone_trace.report(json.loads(out.read_text()))
    jobs = got["functions"]["write_batch"]
    assert (5, 1.0, True) == (
        got["commits"],
        jobs["calls_per_commit"],
        jobs["cpu_us_per_commit"] > 0,
    )


def test_switch_calls_hands_on_every_reply_frame_in_both_modes() -> None:
    """bench_switch_calls: each reply frame reaches the other end, on a link with no
    sequencer and on a switched one (the round asserts it; a timing is not); the
    switched link's call frames go plainly, none in the sequence."""
    rounds = [bench_switch_calls._round(40, switched=s) for s in (False, True)]
    assert [0, 0] == [sequenced for took, sequenced in rounds]
    assert all(took > 0 for took, _ in rounds)
