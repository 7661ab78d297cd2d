"""``hearthnet peers`` table: the path column of relayed peers, the federated column."""

from __future__ import annotations

from typing import Any

from hearthnet.commands.mesh import PEER_COLUMNS, peer_columns, with_relay_names
from hearthnet.commands.output import table

RELAY = "ed25519:lRgglqjk2ywBbOclke5fhAkqVfPqZbZ6hZNTVVFQcYk"
HOME = "ed25519:Baql9NzjDJ_tDDn3c5v2ib3e2RcBlRKV2ziG4az4KVU"


def _peer(node: str, name: str | None, path: str, via: str | None) -> dict[str, Any]:
    return {
        "node": node,
        "name": name,
        "linked": True,
        "direction": "outbound",
        "url": None if via else "http://203.0.113.10:7080",
        "rtt_ms_p50": 2.0,
        "loss_pct": 0.0,
        "path": path,
        "via": via,
    }


def _path_cells(peers: list[dict[str, Any]]) -> list[str]:
    lines = table(with_relay_names(peers), PEER_COLUMNS).splitlines()
    start = lines[0].index("path")
    return [line[start:].split("  ")[0] for line in lines[1:]]


def test_relayed_peer_names_its_relay_by_name() -> None:
    """A relay that is in the list (it is linked) is shown by its name."""
    peers = [_peer(RELAY, "vm-sumc", "direct", None), _peer(HOME, "vm-awvk", "relayed", RELAY)]
    assert ["direct", "relayed via vm-sumc"] == _path_cells(peers)


def test_a_relay_of_ours_says_so_in_the_path_column() -> None:
    """A linked relay of our community: ``direct (relay)``; a member: ``direct``."""
    peers = [{**_peer(RELAY, "vm-sumc", "direct", None), "relay": True}]
    peers.append({**_peer(HOME, "vm-awvk", "direct", None), "relay": False})
    assert ["direct (relay)", "direct"] == _path_cells(peers)


def test_relay_without_a_name_keeps_its_node_id() -> None:
    """A relay the list does not name stays a NodeID, and the JSON rows are not changed."""
    peers = [_peer(HOME, "vm-awvk", "relayed", RELAY)]
    prefix = "relayed via " + RELAY[:20]
    assert [prefix] == [cell[: len(prefix)] for cell in _path_cells(peers)]
    assert RELAY == peers[0]["via"]


def test_federated_nodes_get_a_column_saying_what_they_are() -> None:
    """A bridge and a relay of another community show role and community; the column
    is there only when such a node is linked."""
    community = "ed25519:" + "B" * 43
    ours = [_peer(RELAY, "vm-sumc", "direct", None)]
    theirs = [
        {**_peer(HOME, "vm-awvk", "relayed", RELAY), "community": community, "bridge": True},
        {**_peer(RELAY[:-1] + "Z", None, "direct", None), "community": community, "relay": True},
    ]
    lines = table(with_relay_names(ours + theirs), peer_columns(ours + theirs)).splitlines()
    start = lines[0].index("federated")
    assert (PEER_COLUMNS, ["-", f"bridge {community}", f"relay {community}"]) == (
        peer_columns(ours),
        [line[start:].strip() for line in lines[1:]],
    )
