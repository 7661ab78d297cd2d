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
from pyspark.sql import functions as sf


def relay_dependence(sums: DataFrame, nodes: DataFrame) -> DataFrame:
    """Per node: ``nid, links, relayed_links, link_share, pings, relayed_pings, traffic_share,
    relays, is_relay, relay_only`` (``relays``: ids of the relays it used).

    Args:
        sums: per-link hour sums (:func:`spark_federation.links.link_hour_sums`).
        nodes: ``nid`` of every node.
    """
    per_link = (
        sums.groupBy("nid", "pid")
        .agg(
            (sf.sum("pongs") + sf.sum("misses")).alias("pings"),
            sf.sum("relayed").alias("relayed"),
            sf.max("vid").alias("vid"),
        )
        .where(sf.col("pings") > 0)
    )
    relays = per_link.where(sf.col("vid").isNotNull()).select(sf.col("vid").alias("rid")).distinct()
    per_node = per_link.groupBy("nid").agg(
        sf.count(sf.lit(1)).alias("links"),
        sf.sum((sf.col("relayed") > 0).cast("long")).alias("relayed_links"),
        sf.sum("pings").alias("pings"),
        sf.sum("relayed").alias("relayed_pings"),
        sf.sort_array(sf.collect_set("vid")).alias("relays"),
    )
    # every join shuffles (hint): the small sides are aggregates, and broadcasting one
    # would cost a Spark job of its own each (the whole table is then one job)
    direct_to_members = (
        per_link.where(sf.col("pings") > sf.col("relayed"))
        .join(relays.hint("shuffle_hash"), sf.col("pid") == sf.col("rid"), how="left_anti")
        .groupBy("nid")
        .agg(sf.count(sf.lit(1)).alias("direct_members"))
    )
    return (
        nodes.select("nid")
        .join(per_node.hint("shuffle_hash"), on="nid", how="left")
        .join(direct_to_members.hint("shuffle_hash"), on="nid", how="left")
        .join(relays.hint("shuffle_hash"), sf.col("nid") == sf.col("rid"), how="left")
        .select(
            "nid",
            sf.coalesce(sf.col("links"), sf.lit(0)).alias("links"),
            sf.coalesce(sf.col("relayed_links"), sf.lit(0)).alias("relayed_links"),
            sf.try_divide(sf.col("relayed_links"), sf.col("links")).alias("link_share"),
            sf.coalesce(sf.col("pings"), sf.lit(0)).alias("pings"),
            sf.coalesce(sf.col("relayed_pings"), sf.lit(0)).alias("relayed_pings"),
            sf.try_divide(sf.col("relayed_pings"), sf.col("pings")).alias("traffic_share"),
            sf.coalesce(sf.col("relays"), sf.array().cast("array<bigint>")).alias("relays"),
            sf.col("rid").isNotNull().alias("is_relay"),
            (
                sf.col("rid").isNull()
                & (sf.coalesce(sf.col("relayed_links"), sf.lit(0)) > 0)
                & (sf.coalesce(sf.col("direct_members"), sf.lit(0)) == 0)
            ).alias("relay_only"),
        )
    )
