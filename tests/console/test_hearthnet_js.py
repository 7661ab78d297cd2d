"""hearthnet.js's pure helpers agree with the node: topic matching (spec §6.1), ULIDs and
token decoding, run in Node.js (no browser needed)."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources

import pytest

from hearthnet.identity import KeyPair
from hearthnet.ids import is_ulid
from hearthnet.pubsub.topics import TopicPattern
from hearthnet.tokens import CapabilityToken, Scope

NODE = shutil.which("node")
CASES = [
    ("a.b", "a.b"),
    ("a.*", "a.b"),
    ("a.*", "a.b.c"),
    ("a.**", "a"),
    ("a.**", "a.b"),
    ("a.**", "a.b.c"),
    ("*.b.**", "x.b.c.d"),
    ("**", "a"),
    ("a.**.z", "a.b.c.z"),
    ("chat.session.*", "chat.session"),
]


@pytest.mark.skipif(NODE is None, reason="no node (apt-get install nodejs)")
def test_helpers_agree_with_the_node() -> None:
    """topicMatches gives the node's answers; ulid() makes ULIDs; decodeToken reads a token."""
    keys = KeyPair.generate()
    token = CapabilityToken.issue(
        keys, community=keys.node_id, scopes=[Scope("sub", "a.**")], ttl_ms=1000, now_ms=1
    )
    source = resources.files("hearthnet") / "static" / "hearthnet.js"
    script = f"""
const hn = await import({json.dumps("file://" + str(source))});
const cases = {json.dumps(CASES)};
console.log(JSON.stringify({{
  matches: cases.map(([p, t]) => hn.topicMatches(p, t)),
  ulids: [hn.ulid(), hn.ulid(1_700_000_000_000)],
  claims: hn.decodeToken({json.dumps(token.encode())}),
}}));
"""
    assert NODE is not None
    out = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    got = json.loads(out.stdout)
    assert (
        [TopicPattern.parse(p).matches(t) for p, t in CASES],
        [True, True],
        token.to_json(),
    ) == (got["matches"], [is_ulid(u) for u in got["ulids"]], got["claims"])
