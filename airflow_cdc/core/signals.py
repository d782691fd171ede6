"""Ad hoc snapshot signals: Debezium's ``execute-snapshot`` and ``stop-snapshot`` data.

Accepted shapes (from DAG run conf, the trigger form, the CLI or Python)::

    {"type": "execute-snapshot", "data": {"data-collections": ["public.orders"], "type": "incremental",
      "additional-conditions": [{"data-collection": "public.orders", "filter": "status = 'open'"}],
      "surrogate-key": "order_no"}}
    {"execute-snapshot": {...data...}}         # run-conf shorthand
    {"type": "stop-snapshot", "data": {"data-collections": [...], "type": "incremental"}}
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.snapshot import SnapshotContext, match_tables

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotSignal:
    action: str  # execute-snapshot | stop-snapshot
    data_collections: tuple[str, ...] = ()
    conditions: dict[str, str] = field(default_factory=dict)
    surrogate_key: str | None = None


def parse_signal(raw: dict[str, Any] | str) -> SnapshotSignal:
    """Validate one signal.

    :raises ConfigError: naming the bad field.
    """
    doc = json.loads(raw) if isinstance(raw, str) else dict(raw)
    if "type" in doc and "data" in doc:
        action, data = doc["type"], doc["data"]
    elif len(doc) == 1 and next(iter(doc)) in ("execute-snapshot", "stop-snapshot"):
        action, data = next(iter(doc.items()))
    else:
        raise ConfigError(
            f"signal {doc!r}: expected {{'type': 'execute-snapshot'|'stop-snapshot', 'data': {{...}}}}"
        )
    if isinstance(data, str):
        data = json.loads(data or "{}")
    if action not in ("execute-snapshot", "stop-snapshot"):
        raise ConfigError(f"signal type {action!r} is not supported; use execute-snapshot or stop-snapshot")
    kind = str(data.get("type", "incremental")).lower()
    if kind == "blocking":
        log.warning("blocking snapshots are run as incremental snapshots (never one long transaction)")
    elif kind != "incremental":
        raise ConfigError(f"signal {action}: snapshot type {kind!r} is not supported (incremental, blocking)")
    collections = data.get("data-collections") or []
    if isinstance(collections, str):
        collections = [c.strip() for c in collections.split(",") if c.strip()]
    if action == "execute-snapshot" and not collections:
        raise ConfigError("signal execute-snapshot: 'data-collections' must name at least one table")
    conditions = {}
    for cond in data.get("additional-conditions") or []:
        if not isinstance(cond, dict) or "data-collection" not in cond or "filter" not in cond:
            raise ConfigError(
                f"signal {action}: each additional-conditions entry needs 'data-collection' "
                f"and 'filter', got {cond!r}"
            )
        conditions[str(cond["data-collection"])] = str(cond["filter"])
    return SnapshotSignal(action, tuple(collections), conditions, data.get("surrogate-key") or None)


def apply_signals(ctx: SnapshotContext, signals: list[SnapshotSignal], tables: list[str]) -> list[str]:
    """Apply signals to the snapshot context; returns log lines saying what changed."""
    notes = []
    for sig in signals:
        if sig.action == "stop-snapshot":
            stopped = ctx.stop(match_tables(sig.data_collections, tables) if sig.data_collections else None)
            notes.append(f"stop-snapshot: stopped {stopped or 'nothing'}")
            continue
        matched = match_tables(sig.data_collections, tables)
        if not matched:
            raise ConfigError(
                f"execute-snapshot: data-collections {list(sig.data_collections)} match no "
                f"captured table (captured: {tables})"
            )
        conds = {t: f for pattern, f in sig.conditions.items() for t in match_tables([pattern], matched)}
        ctx.add(matched, "adhoc", conds, sig.surrogate_key)
        notes.append(f"execute-snapshot: queued {matched}")
    return notes
