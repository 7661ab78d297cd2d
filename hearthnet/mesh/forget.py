"""``hearthnet peers forget NODEID|ADDRESS`` (a machine that left for good): forget its
addresses in a :class:`~hearthnet.mesh.addresses.PeerBook` and say what will still bring it
back. Pure: the running node calls it on its own book (``POST /mesh/v1/peers/forget``,
so that it stops dialling at once), the CLI on the saved book of a stopped node."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hearthnet.errors import NotFound
from hearthnet.ids import is_node_id
from hearthnet.mesh.addresses import PeerBook, same_place, well_formed

FORGET_PATH = "/mesh/v1/peers/forget"


def forget(
    book: PeerBook,
    target: str,
    *,
    links: Mapping[str, str | None],
    configured: Iterable[str],
) -> dict[str, Any]:
    """Forget ``target``'s addresses in ``book`` (the caller saves it); the answer
    ``{target, forgotten: [url], linked: [NodeID], configured: [url]}``: the URLs
    forgotten, the nodes among them linked now (``links``: NodeID -> the address its link
    uses, None when inbound or relayed; a link stays up until it ends), and the
    configured addresses among them (``--peer``, ``[mesh] peers``, ``relay_urls``,
    ``relay_peers``), which the next start dials again.

    Raises:
        NotFound: no known address matched (a typo, or a node only linked to us).
    """
    removed = book.forget(target)
    linked = {a.node for a in removed if a.node is not None and a.node in links}
    if is_node_id(target):
        linked |= {target} & set(links)
    else:
        linked |= {n for n, at in links.items() if at is not None and same_place(at, target)}
    if not removed:
        why = f"no known address matches {target}: hearthnet peers lists the known ones"
        if linked:
            why += (
                "; it is linked now, by its own dial (an anchor keeps a node out for good with"
                " hearthnet community revoke NODEID)"
            )
        raise NotFound(why)
    forgotten = [a.url for a in removed]
    return {
        "target": target,
        "forgotten": forgotten,
        "linked": sorted(linked),
        "configured": sorted(
            {u for u in well_formed(configured) if any(same_place(u, f) for f in forgotten)}
        ),
    }


def forget_notes(answer: Mapping[str, Any]) -> list[str]:
    """What still brings a forgotten peer back, for people (``hearthnet: note: ...``)."""
    notes = [
        f"{node} is linked now: the link stays up until it ends (an anchor keeps a node out"
        " for good with hearthnet community revoke NODEID)"
        for node in answer["linked"]
    ]
    notes += [
        f"{url} is configured (--peer, [mesh] peers, relay_urls or relay_peers): remove it"
        " there, or this node dials it again (from the next start; a relay dials a"
        " relay_peers address it has not reached yet even now)"
        for url in answer["configured"]
    ]
    return notes
