"""A connector's health now: the retained log and the guard (the sensor), and the metrics document
``airflow-cdc status --json`` prints (each step's last values plus what is measured now).

The document is also what a UI reads: :func:`status_metrics` needs only the config and the stored
state; the live part needs the source, and says so when it could not reach it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from airflow_cdc.core import retained as rl
from airflow_cdc.core import step_metrics as sm
from airflow_cdc.core.batch import batches_at
from airflow_cdc.core.batch_read import Batch
from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.metrics import MetricsFile, MetricsRecorder

log = logging.getLogger(__name__)


def committed_position_time(
    config: ConnectorConfig, state: dict[str, Any] | None, doc: dict[str, Any]
) -> Any:
    """When the source stood at the committed offset (epoch ms), from the commit's metrics or the
    committed batch's manifest while it is staged; None when neither tells."""
    last = (state or {}).get("last_batch")
    commit = doc.get("commit") or {}
    if last is not None and commit.get("batch_id") == last:
        return commit.get("position_time_ms")
    if last is None:
        return None
    try:
        return sm.position_time(Batch(batches_at(config["staging.path"], config.state_name) / last).manifest)
    except Exception:  # noqa: BLE001 - expired or unreadable: unknown
        return None


def _applied(state: dict[str, Any] | None, doc: dict[str, Any]) -> tuple[str | None, Any, Any]:
    """(batch id, offset, position time) of the newest batch silver reflects: the last applied
    one when it is newer than the committed one, else the committed one."""
    apply, commit = doc.get("apply") or {}, doc.get("commit") or {}
    committed = (state or {}).get("last_batch")
    if apply.get("batch_id") and (committed is None or apply["batch_id"] > committed):
        return apply["batch_id"], apply.get("offset"), apply.get("position_time_ms")
    return committed, (state or {}).get("offset"), commit.get("position_time_ms")


def source_check(config: ConnectorConfig, state: dict[str, Any] | None) -> tuple[MetricsRecorder, rl.Verdict]:
    """Measure the retained log, the position age and silver's lag now, and decide the guard.

    Saved as the ``sensor`` section of the metrics file.  An unreachable source leaves the live
    values out (the guard then judges the position age alone).
    """
    doc = MetricsFile(config).load()
    rec = MetricsRecorder(config)
    applied_batch, applied_offset, applied_time = _applied(state, doc)
    offset = (state or {}).get("offset")
    verdict = sm.record_source(
        rec, config, offset, applied_offset, committed_position_time(config, state, doc)
    )
    rec.set("silver", "LagMs", rl.age_ms(applied_time))
    sm.record_staging(rec, config, applied_batch)
    MetricsFile(config).save("sensor", rec, offset=offset, tripped=verdict.tripped, message=verdict.message)
    return rec, verdict


def status_metrics(
    config: ConnectorConfig, state: dict[str, Any] | None, live: bool = True
) -> dict[str, Any]:
    """The metrics part of ``status --json``: ``last`` (each step's saved section: ``capture``,
    ``apply``, ``commit``, ``sensor``, each with ``at`` and ``metrics``), ``now`` (ages recomputed,
    and with ``live`` the retained log read from the source), ``guard`` and ``tags``."""
    doc = MetricsFile(config).load()
    rec = MetricsRecorder(config)
    applied_batch, applied_offset, applied_time = _applied(state, doc)
    rec.set("silver", "LagMs", rl.age_ms(applied_time))
    position = committed_position_time(config, state, doc)
    rec.set("source", "PositionAgeMs", rl.age_ms(position))
    sm.record_staging(rec, config, applied_batch)
    out: dict[str, Any] = {"tags": rec.tags, "last": doc}
    if live and state is not None and state.get("offset") is not None:
        started = time.monotonic()
        try:
            retained = rl.read_retained(config, state["offset"], applied_offset)
            rec.set("streaming", "Connected", 1)
        except Exception as e:  # noqa: BLE001 - the document is still useful without the source
            retained = None
            rec.set("streaming", "Connected", 0)
            out["live_error"] = str(e)
        verdict = rl.evaluate(config, retained, rl.age_ms(position))
        rl.record(rec, retained, rl.age_ms(position), verdict)
        out["guard"] = {
            "tripped": verdict.tripped,
            "message": verdict.message,
            "limit_bytes": verdict.limit_bytes,
            "limit_age_ms": verdict.limit_age_ms,
            "used_fraction": verdict.used,
        }
        out["live_seconds"] = round(time.monotonic() - started, 3)
    out["now"] = rec.to_json()
    out["points"] = [{"name": p.name, "value": p.value, "tags": p.tags} for p in rec.points()]
    return out
