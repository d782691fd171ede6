"""Ad hoc snapshot signals: Debezium's ``execute-snapshot`` and ``stop-snapshot`` data.

Accepted shapes (from DAG run conf, the trigger form, the CLI or Python)::

    {"type": "execute-snapshot", "data": {"data-collections": ["public.orders"], "type": "incremental",
      "additional-conditions": [{"data-collection": "public.orders", "filter": "status = 'open'"}],
      "surrogate-key": "order_no"}}
    {"execute-snapshot": {...data...}}         # run-conf shorthand
    {"type": "stop-snapshot", "data": {"data-collections": [...], "type": "incremental"}}

``"type": "incremental"`` (the default) queues chunked, watermarked snapshots in the snapshot
context; ``"type": "blocking"`` asks the run that meets the signal to read the tables whole at one
exact log position (:mod:`airflow_cdc.core.snapshot_blocking`): nothing is queued, so a committed
run never repeats it and a run that dies before its commit meets the signal again.

A filter is a condition in the safe language of :mod:`airflow_cdc.core.conditions` (raw SQL only
with the pipeline property ``snapshot.additional.conditions.raw.sql``); :func:`check_signals`
parses it against the table's columns before a capture run stores anything.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_cdc.core.conditions import condition_pieces
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.snapshot import SnapshotContext, TableSnapshot, match_tables

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SnapshotSignal:
    action: str  # execute-snapshot | stop-snapshot
    data_collections: tuple[str, ...] = ()
    conditions: dict[str, str] = field(default_factory=dict)
    surrogate_key: str | None = None
    kind: str = "incremental"  # incremental | blocking


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
    if kind not in ("incremental", "blocking"):
        raise ConfigError(f"signal {action}: snapshot type {kind!r} is not supported (incremental, blocking)")
    if kind == "blocking" and data.get("surrogate-key"):
        raise ConfigError(
            f"signal {action}: 'surrogate-key' chunks an incremental snapshot; a blocking snapshot "
            "reads its tables whole (drop the surrogate-key, or use \"type\": \"incremental\")"
        )
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
    surrogate = data.get("surrogate-key") or None
    return SnapshotSignal(action, tuple(collections), conditions, surrogate, kind)


def _execute_tables(sig: SnapshotSignal, tables: list[str]) -> tuple[list[str], dict[str, str]]:
    """The captured tables an execute-snapshot signal names, and each one's condition.

    :raises ConfigError: no captured table matches, or an additional-conditions entry names none
        of them (its table would be snapshotted unfiltered).
    """
    matched = match_tables(sig.data_collections, tables)
    if not matched:
        raise ConfigError(
            f"execute-snapshot: data-collections {list(sig.data_collections)} match no "
            f"captured table (captured: {tables})"
        )
    conds: dict[str, str] = {}
    for pattern, text in sig.conditions.items():
        hit = match_tables([pattern], matched)
        if not hit:
            raise ConfigError(
                f"execute-snapshot: additional-conditions data-collection {pattern!r} matches none of "
                f"the tables to snapshot {matched}"
            )
        conds.update((t, text) for t in hit)
    return matched, conds


def check_signals(
    signals: list[SnapshotSignal],
    tables: list[str],
    columns_of: Callable[[str], Sequence[str] | None],
    raw_sql: bool,
    blocking_refused: str | None = None,
) -> None:
    """Validate execute-snapshot signals against the captured tables, before anything is stored.

    Each additional condition is parsed in the safe condition language against its table's
    columns (``columns_of(table)``, None when the source cannot tell), unless ``raw_sql``.

    :param blocking_refused: why the source cannot run ``blocking`` snapshots (None: it can).
    :raises ConfigError: naming the signal field, table and column at fault, or a ``blocking``
        snapshot the source cannot run (with ``incremental`` as the alternative).
    """
    for sig in signals:
        if sig.action != "execute-snapshot":
            continue
        if sig.kind == "blocking" and blocking_refused is not None:
            raise ConfigError(
                f"signal execute-snapshot: snapshot type 'blocking' is not supported: {blocking_refused}",
                hint='send the signal with "type": "incremental" (chunked, watermarked, exact)',
            )
        _, conds = _execute_tables(sig, tables)
        for table, text in conds.items():
            condition_pieces(table, text, None if raw_sql else columns_of(table), raw_sql)


def apply_signals(
    ctx: SnapshotContext,
    signals: list[SnapshotSignal],
    tables: list[str],
    blocking: list[TableSnapshot] | None = None,
) -> list[str]:
    """Apply signals to the snapshot context; returns log lines saying what changed.

    An incremental ``execute-snapshot`` queues its tables in ``ctx``; a blocking one appends them
    to ``blocking`` (origin ``blocking``), for this run to read whole, and stores nothing.

    :raises ConfigError: as :func:`check_signals` (without parsing the conditions); a blocking
        signal without a ``blocking`` list to take it.
    """
    notes = []
    for sig in signals:
        if sig.action == "stop-snapshot":
            stopped = ctx.stop(match_tables(sig.data_collections, tables) if sig.data_collections else None)
            notes.append(f"stop-snapshot: stopped {stopped or 'nothing'}")
            continue
        matched, conds = _execute_tables(sig, tables)
        if sig.kind == "blocking":
            if blocking is None:
                raise ConfigError("signal execute-snapshot: a blocking snapshot cannot be run here")
            blocking.extend(TableSnapshot(t, "blocking", conds.get(t)) for t in matched)
            notes.append(f"execute-snapshot (blocking): {matched} read whole in this run")
            continue
        ctx.add(matched, "adhoc", conds, sig.surrogate_key)
        notes.append(f"execute-snapshot: queued {matched}")
    return notes
