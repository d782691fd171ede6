"""Issue 38: the apply step's metrics, the staging counts and the offline ``status`` document, from
manifests and the metrics file alone (no server)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from airflow_cdc.core.health import status_metrics
from airflow_cdc.core.pipeline import build_config
from airflow_cdc.core.step_metrics import record_apply

IDS = ["20261201T000000000000Z-aaaaaa", "20261201T000001000000Z-bbbbbb", "20261201T000002000000Z-cccccc"]


def _config(tmp_path: Path) -> Any:
    config = build_config(
        {"name": "shop", "connector": "postgresql", "staging.path": str(tmp_path), "database.dbname": "d"}
    )
    for batch_id in IDS:  # three staged batches (the counts read names only)
        (tmp_path / "shop" / "batches" / batch_id).mkdir(parents=True)
    return config


def _manifest(batch_id: str, events: int, position_ms: float) -> dict[str, Any]:
    return {
        "batch_id": batch_id,
        "to_offset": {"lsn": "0/10"},
        "counts": {"events": events, "snapshot_rows": 1},
        "metrics": {"capture": {"PositionTimeMs": position_ms}},
    }


def test_apply_records_lag_counts_and_what_is_left(tmp_path: Path) -> None:
    config = _config(tmp_path)
    now_ms = time.time() * 1000
    rec = record_apply(
        config, [_manifest(IDS[0], 5, now_ms - 60_000), _manifest(IDS[1], 7, now_ms - 2_000)], 1.5
    )
    doc = rec.to_json()
    assert doc["apply"] == {"BatchesApplied": 2, "DurationMs": 1500.0, "EventsApplied": 14}
    assert 2_000 <= doc["silver"]["LagMs"] < 60_000  # the newest applied batch's position counts
    assert doc["staging"] == {"BatchesNotApplied": 1, "BatchesStaged": 3}

    offline = status_metrics(config, {"offset": {"lsn": "0/5"}, "last_batch": IDS[0]}, live=False)
    assert offline["last"]["apply"]["batch_id"] == IDS[1]
    assert offline["now"]["staging"]["BatchesNotApplied"] == 1 and offline["now"]["silver"]["LagMs"] >= 2_000
    assert "guard" not in offline and offline["tags"] == {"connector": "shop", "server": "shop"}
    names = {p["name"] for p in offline["points"]}
    assert {"airflow_cdc.silver.LagMs", "airflow_cdc.staging.BatchesNotApplied"} <= names


def test_a_manifest_without_metrics_or_offsets_still_records(tmp_path: Path) -> None:
    rec = record_apply(_config(tmp_path), [{"batch_id": IDS[2]}], 0.1)
    assert rec.get("apply", "BatchesApplied") == 1 and rec.get("silver", "LagMs") is None
    assert rec.get("staging", "BatchesNotApplied") == 0
