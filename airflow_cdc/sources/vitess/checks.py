"""The connection check of a Vitess source (the Airflow connection form's *Test*): read only."""

from __future__ import annotations

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.sources.vitess.client import VtgateClient
from airflow_cdc.sources.vitess.offsets import CURRENT


def check_connection(config: ConnectorConfig) -> str:
    """Reach vtgate, list the keyspace's tables and open a VStream for its current positions.

    :returns: what was found (tables, shards and their positions).
    :raises ConnectionFailed / AuthenticationFailed / ConfigError: as capture would report them
        (vtgate unreachable, bad credentials, unknown keyspace or shard).
    """
    client = VtgateClient(config)
    try:
        keyspace, shard = config["vitess.keyspace"], config["vitess.shard"] or None
        tables = client.list_tables(keyspace)
        vgtid = client.current_vgtid(keyspace, shard)
    finally:
        client.close()
    shards = ", ".join(f"{g.shard}@{g.gtid}" for g in vgtid.shard_gtids if g.gtid != CURRENT)
    return (
        f"vtgate at {client.where}: keyspace {keyspace!r} has {len(tables)} table(s); VStream answered "
        f"with the positions of {len(vgtid.shard_gtids)} shard(s): {shards}"
    )
