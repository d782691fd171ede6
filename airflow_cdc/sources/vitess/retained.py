"""What a Vitess keyspace keeps for the connector (monitoring, the sensor's guard).

vtgate exposes neither the tablets' binlog sizes nor their expiry, so there is no server-side
measure: the guard uses the committed position's age (``retained.log.max.age.ms``), which the
core computes for every source from the committed batch's metrics.
"""

from __future__ import annotations

from typing import Any

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.retained import RetainedLog


def retained_log(
    config: ConnectorConfig, offset: dict[str, Any], applied: dict[str, Any] | None
) -> RetainedLog:
    """No live query: the shards the committed VGTID names, as the detail."""
    shards = [
        f"{g.get('keyspace')}/{g.get('shard')}" for g in (offset.get("vgtid") or []) if isinstance(g, dict)
    ]
    detail = f"VGTID of {len(shards)} shard(s) ({', '.join(shards[:8])})" if shards else ""
    return RetainedLog(detail=detail)
