"""Configuration: TOML < environment < flags, validation, and the docs page (spec §9)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hearthnet.cli import build_parser
from hearthnet.commands.common import config_of
from hearthnet.config import (
    configuration_table,
    default_node_name,
    load_config,
    stray_environment,
    to_toml,
)
from hearthnet.errors import ConfigError

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    """A flag beats the environment, which beats the file, which beats the default."""
    path = tmp_path / "hearthnet.toml"
    path.write_text("[node]\nport = 1111\nname = 'file'\n[transport]\nws_ping_s = 5\n")
    config = load_config(
        path,
        env={"HEARTHNET_NODE_PORT": "2222", "HEARTHNET_TRANSPORT_WS_IDLE_S": "9"},
        overrides={"node": {"port": 3333}},
    )
    assert (3333, "file", 5.0, 9.0, 16) == (
        config.node.port,
        config.node.name,
        config.transport.ws_ping_s,
        config.transport.ws_idle_s,
        config.transport.stream_window,
    )


def test_data_dir_env_shortcut(tmp_path: Path) -> None:
    """HEARTHNET_DATA_DIR sets the data directory (spec §1.2)."""
    assert tmp_path == load_config(None, env={"HEARTHNET_DATA_DIR": str(tmp_path)}).data_path


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[nodes]\nport = 1\n", r"unknown section \[nodes\] \(did you mean node\?\)"),
        ("[node]\nprot = 1\n", r"unknown key \[node\] prot \(did you mean port\?\)"),
        ("[node]\nzzz = 1\n", r"unknown key \[node\] zzz$"),
        ("[node]\nport = 'x'\n", "expected int"),
        ("[node\n", "hearthnet.toml"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path: Path, toml: str, message: str) -> None:
    """Unknown sections or keys, wrong types and broken TOML are refused with the place named."""
    path = tmp_path / "hearthnet.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=message):
        load_config(path, env={})


def test_bad_environment_value_refused() -> None:
    """A malformed environment override names the variable's key."""
    with pytest.raises(ConfigError, match="ws_ping_s"):
        load_config(None, env={"HEARTHNET_TRANSPORT_WS_PING_S": "soon"})


def test_environment_variables_that_are_not_keys_are_left_alone() -> None:
    """The LLM API key lives in HEARTHNET_LLM_API_KEY by default: a node must start with it
    set, and it must not become configuration."""
    config = load_config(
        None, env={"HEARTHNET_LLM_API_KEY": "sk-secret", "HEARTHNET_LLM_MODEL": "m1"}
    )
    assert ("m1", "HEARTHNET_LLM_API_KEY") == (config.llm.model, config.llm.api_key_env)
    assert "sk-secret" not in to_toml(config)


def test_config_show_output_loads_back(tmp_path: Path) -> None:
    """`config show` prints TOML that loads back to the same configuration."""
    config = load_config(
        None, env={}, overrides={"node": {"port": 4242, "data_dir": str(tmp_path)}}
    )
    path = tmp_path / "shown.toml"
    path.write_text(to_toml(config))
    tomllib.loads(path.read_text())
    assert config == load_config(path, env={})


def test_docs_list_every_key() -> None:
    """docs/configuration.md carries the generated table of every key and default."""
    assert configuration_table() in DOCS.read_text(encoding="utf-8")


def test_relay_flags_set_the_mesh_relay_keys(tmp_path: Path) -> None:
    """`node start --relay --relay-url A --relay-url B` sets mesh.relay and mesh.relay_urls."""
    args = build_parser().parse_args(
        [
            "node",
            "start",
            "--data-dir",
            str(tmp_path),
            "--relay",
            "--relay-url",
            "https://relay-a.example:7080",
            "--relay-url",
            "https://relay-b.example:7080",
        ]
    )
    config = config_of(args)
    assert (True, ("https://relay-a.example:7080", "https://relay-b.example:7080")) == (
        config.mesh.relay,
        config.mesh.relay_urls,
    )


def test_default_node_name_is_host_and_short_id() -> None:
    """No configured name: the host's first label and the short id's first 4 characters."""
    node = "ed25519:" + "A" * 43
    configured = load_config(None, env={"HEARTHNET_NODE_NAME": "attic"}).node
    assert ("vm-aaaa", "node-aaaa", "attic") == (
        default_node_name("vm.example.org", node),
        default_node_name("", node),
        configured.display_name(node),
    )


def test_environment_variables_that_name_no_key_are_named_with_the_nearest_key() -> None:
    """A misspelt variable (``HEARTHNET_LOG_LEVEL``) is ignored like the API key's, but
    said so, with the key it most likely meant; the API key and the data dir shortcut are
    not named."""
    env = {
        "HEARTHNET_LOG_LEVEL": "warning",
        "HEARTHNET_LLM_API_KEY": "sk-secret",
        "HEARTHNET_DATA_DIR": "/tmp/x",
        "HEARTHNET_NODE_PORT": "7081",
        "HEARTHNET_ZZZ": "1",
    }
    assert [
        "environment variable HEARTHNET_LOG_LEVEL is ignored: it names no configuration key"
        " (did you mean HEARTHNET_NODE_LOG_LEVEL?)",
        "environment variable HEARTHNET_ZZZ is ignored: it names no configuration key"
        " (docs/configuration.md lists them)",
    ] == stray_environment(load_config(None, env=env), env)


@pytest.mark.parametrize(
    ("section", "key", "value", "choices"),
    [
        ("node", "log_level", "verbose", "debug, info, warning, error"),
        ("node", "tls", "maybe", "auto, on, off"),
        ("pubsub", "sync", "fast", "full, normal"),
    ],
)
def test_a_value_a_key_does_not_take_is_refused_with_the_values_it_takes(
    section: str, key: str, value: str, choices: str
) -> None:
    """``log_level = "verbose"`` once started a node logging at info without a word, and
    ``tls``/``sync`` were refused only once a node got that far; each is now refused when
    the configuration loads, naming the values the key takes."""
    variable = f"HEARTHNET_{section.upper()}_{key.upper()}"
    with pytest.raises(ConfigError) as refused:
        load_config(None, env={variable: value})
    assert f"environment [{section}] {key}: {value!r} is not one of {choices}" == str(refused.value)


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("HEARTHNET_MESH_ANTI_ENTROPY_S", "0", "0.0 must be more than 0 (a period: how often"),
        ("HEARTHNET_PUBSUB_RETENTION_INTERVAL_S", "-1", "-1.0 must be more than 0"),
        ("HEARTHNET_MESH_MAX_LINKS", "-1", "-1 must not be negative"),
        ("HEARTHNET_PUBSUB_MAX_AGE_S", "nan", "nan is not a number"),
    ],
)
def test_numbers_a_key_cannot_take_are_refused(variable: str, value: str, says: str) -> None:
    """``anti_entropy_s = 0`` (say, to turn repair off) once started a node whose loop ran
    every 0 s and took a whole core; an interval must be more than 0, and no number may be
    negative or NaN."""
    with pytest.raises(ConfigError) as refused:
        load_config(None, env={variable: value})
    assert says in str(refused.value)
