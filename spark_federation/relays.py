"""Who depends on relays (spec §8, §10).

A *relay* is any node named in the ``via`` of a record. Per node, the share of
its links (peers it pinged) that went via a relay, and the share of its pings
(the traffic the heartbeat log shows) that did. A node is *relay-only* when it
is not a relay itself, has at least one relayed link, and has no direct link to
a node that is not a relay: it reaches the mesh only through relays, so it is
cut off whenever they are.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_federation.schema import MISS, PONG


def relay_dependence(hb: DataFrame, nodes: DataFrame) -> DataFrame:
    """Per node: ``nid, links, relayed_links, link_share, pings, relayed_pings, traffic_share,
    relays, is_relay, relay_only`` (``relays``: ids of the relays it used)."""
    pings = hb.where(F.col("kind").isin(PONG, MISS)).select(
        "nid", "pid", F.coalesce(F.col("relay"), F.lit(False)).alias("relayed"), "vid"
    )
    relays = pings.where(F.col("vid").isNotNull()).select(F.col("vid").alias("rid")).distinct()
    per_node = pings.groupBy("nid").agg(
        F.count_distinct("pid").alias("links"),
        F.count_distinct(F.when(F.col("relayed"), F.col("pid"))).alias("relayed_links"),
        F.count(F.lit(1)).alias("pings"),
        F.sum(F.col("relayed").cast("long")).alias("relayed_pings"),
        F.sort_array(F.collect_set("vid")).alias("relays"),
    )
    direct_to_members = (
        pings.where(~F.col("relayed"))
        .select("nid", "pid")
        .distinct()
        .join(relays, F.col("pid") == F.col("rid"), how="left_anti")
        .groupBy("nid")
        .agg(F.count(F.lit(1)).alias("direct_members"))
    )
    return (
        nodes.select("nid")
        .join(per_node, on="nid", how="left")
        .join(direct_to_members, on="nid", how="left")
        .join(relays, F.col("nid") == F.col("rid"), how="left")
        .select(
            "nid",
            F.coalesce(F.col("links"), F.lit(0)).alias("links"),
            F.coalesce(F.col("relayed_links"), F.lit(0)).alias("relayed_links"),
            (F.col("relayed_links") / F.col("links")).alias("link_share"),
            F.coalesce(F.col("pings"), F.lit(0)).alias("pings"),
            F.coalesce(F.col("relayed_pings"), F.lit(0)).alias("relayed_pings"),
            (F.col("relayed_pings") / F.col("pings")).alias("traffic_share"),
            F.coalesce(F.col("relays"), F.array().cast("array<bigint>")).alias("relays"),
            F.col("rid").isNotNull().alias("is_relay"),
            (
                F.col("rid").isNull()
                & (F.coalesce(F.col("relayed_links"), F.lit(0)) > 0)
                & (F.coalesce(F.col("direct_members"), F.lit(0)) == 0)
            ).alias("relay_only"),
        )
    )
