"""The CDC panel's HTML: one section per pipeline partition, from its ``status --json`` document.

Plain HTML and CSS, no script and no external asset, so it renders in the Airflow UI's sandboxed
iframe and behind a proxy (every link is relative).  Each value cell carries its metric's name and
raw value (``data-metric``, ``data-value``) and the catalog's description as its tooltip.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from html import escape
from typing import Any

from airflow_cdc.core.metrics import CATALOG

_DOC = {f"{m.context}.{m.name}": m.doc for m in CATALOG}
REFRESH_SECONDS = 30
_CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:12px}h1{font-size:18px;margin:0}
h2{font-size:16px;margin:18px 0 6px}h3{font-size:14px;margin:0 0 6px}small,.note{color:#718096}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(330px,1fr));gap:10px}
.card{border:1px solid #cbd5e0;border-radius:6px;padding:8px 10px}table{border-collapse:collapse}
td,th{padding:2px 6px;text-align:left;vertical-align:top}th{white-space:nowrap}
td{font-variant-numeric:tabular-nums;overflow-wrap:anywhere}.bad{color:#c53030;font-weight:600}.ok{color:#2f855a;font-weight:600}
@media (prefers-color-scheme:dark){body{color:#e2e8f0;background:#1a202c}}"""
#: (label, context.Name, format) per card; the values come from the card's sections
LAG = (("Silver lag", "silver.LagMs", "ms"), ("Silver behind the head", "silver.LagBytes", "bytes"),
       ("Committed position age", "source.PositionAgeMs", "ms"),
       ("Batches staged", "staging.BatchesStaged", None),
       ("Staged, not applied", "staging.BatchesNotApplied", None))  # fmt: skip
RETAINED = (("Retained log", "source.RetainedLogBytes", "bytes"),
            ("Retained binlog files", "source.RetainedLogFiles", None),
            ("Behind the head", "source.BehindBytes", "bytes"), ("WAL status", "source.WalStatus", None),
            ("Detail", "source.RetainedLogDetail", None),
            ("Guard used", "source.RetainedLogUsedFraction", "pct"),
            ("Byte limit", "source.RetainedLogLimitBytes", "limit_bytes"),
            ("Age limit", "source.RetainedLogLimitAgeMs", "limit_ms"),
            ("Source reached (1/0)", "streaming.Connected", None))  # fmt: skip
SNAPSHOT = (("State", "snapshot.State", None), ("Tables", "snapshot.TotalTableCount", None),
            ("Tables remaining", "snapshot.RemainingTableCount", None),
            ("Duration", "snapshot.SnapshotDurationInSeconds", "s"), ("Last chunk", "snapshot.ChunkId", None),
            ("Chunk after key", "snapshot.ChunkFrom", None), ("Chunk to key", "snapshot.ChunkTo", None),
            ("Table's largest key", "snapshot.TableTo", None),
            ("Last row", "snapshot.LastEvent", None))  # fmt: skip
STATES = (("SnapshotPaused", "paused"), ("SnapshotRunning", "running"), ("SnapshotAborted", "aborted"),
          ("SnapshotCompleted", "completed"), ("SnapshotSkipped", "skipped"))  # fmt: skip


def _ms(value: Any) -> str:
    seconds = float(value) / 1000
    for limit, unit, size in ((120, "s", 1), (7200, "min", 60), (172800, "h", 3600)):
        if seconds < limit:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds / 86400:.1f} d"


def _bytes(value: Any) -> str:
    n, units = float(value), ["B", "KiB", "MiB", "GiB", "TiB"]
    while n >= 1024 and len(units) > 1:
        n, units = n / 1024, units[1:]
    return f"{int(value)} B" if units[0] == "B" else f"{n:.1f} {units[0]} ({int(value):,} B)"


def _when(at: Any, now: float) -> str:
    stamp = datetime.fromtimestamp(float(at), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{stamp} ({_ms(max(0.0, now - float(at)) * 1000)} ago)"


_FORMATS = {
    "ms": _ms,
    "bytes": _bytes,
    "pct": lambda v: f"{float(v) * 100:.1f} %",
    "s": lambda v: f"{v} s",
    "limit_ms": lambda v: _ms(v) if v else "none",  # 0: no limit
    "limit_bytes": lambda v: _bytes(v) if v else "none",
}
#: rows left out when the source has no such value (binlog files on PostgreSQL, WAL status on MySQL)
OPTIONAL = {"silver.LagBytes", "source.RetainedLogFiles", "source.BehindBytes", "source.WalStatus",
            "source.RetainedLogDetail", "source.RetainedLogUsedFraction"}  # fmt: skip


def _row(label: str, key: str, value: Any, fmt: str | None = None) -> str:
    """One ``label | value`` row; a missing value shows as a dash (``data-value`` empty)."""
    raw = value if isinstance(value, (int, float, str)) or value is None else json.dumps(value)
    text = "—" if value in (None, "") else _FORMATS[fmt](value) if fmt else str(raw)
    return (
        f'<tr><th title="{escape(_DOC.get(key, ""))}">{escape(label)}</th><td data-metric="{escape(key)}" '
        f'data-value="{escape("" if raw is None else str(raw))}">{escape(text)}</td></tr>'
    )


def _card(title: str, spec: tuple, sections: dict[str, Any], extra: str = "") -> str:
    values = [(label, key, (sections.get(key.split(".")[0]) or {}).get(key.split(".")[1]), fmt)
              for label, key, fmt in spec]  # fmt: skip
    rows = [_row(*row) for row in values if row[2] is not None or row[1] not in OPTIONAL]
    return f'<div class="card"><h3>{escape(title)}</h3><table>{"".join(rows)}{extra}</table></div>'


def _saved(last: dict[str, Any], step: str, context: str) -> dict[str, Any]:
    return ((last.get(step) or {}).get("metrics") or {}).get(context) or {}


def _retained(doc: dict[str, Any], now: float) -> tuple[dict[str, Any], str]:
    """The retained-log values measured now (live), else the newest the sensor or a commit saved."""
    live, last = (doc.get("now") or {}).get("source") or {}, doc.get("last") or {}
    if "guard" in doc:
        return live, "measured now"
    steps = [s for s in ("sensor", "commit") if _saved(last, s, "source")]
    if not steps:
        return live, "not measured"
    step = max(steps, key=lambda s: last[s].get("at") or 0)
    return {**_saved(last, step, "source"), **live}, f"saved by {step} {_when(last[step]['at'], now)}"


def _cards(item: dict[str, Any], now: float) -> str:
    doc = item["metrics"]
    current, last = doc.get("now") or {}, doc.get("last") or {}
    source, measured = _retained(doc, now)
    guard = doc.get("guard") or {"tripped": bool(source.get("RetainedLogGuardTripped")),
                                 "message": (last.get("sensor") or {}).get("message")}  # fmt: skip
    said = f"Guard tripped: {guard['message']}" if guard["tripped"] else "Guard: within limits"
    mark = "bad" if guard["tripped"] else "ok"
    verdict = f'<tr><td colspan=2 class="{mark}" data-metric="guard">{escape(said)}</td></tr>'
    offset = _row("Committed offset", "state.offset", item.get("offset"))
    snap = _saved(last, "capture", "snapshot")
    state = next((name for key, name in STATES if snap.get(key)), "none")
    scanned = "".join(_row(f"Rows scanned: {table}", "snapshot.RowsScanned", values.get("RowsScanned"))
                      for table, values in sorted((snap.get("tables") or {}).items()))  # fmt: skip
    runs = []
    for step in ("capture", "apply", "commit", "sensor"):
        saved, took = last.get(step) or {}, _saved(last, step, step).get("DurationMs")
        runs.append(_row(step, f"{step}.at", _when(saved["at"], now) if saved.get("at") else None))
        if took is not None:
            runs.append(_row(f"{step} took", f"{step}.DurationMs", took, "ms"))
        if saved.get("batch_id"):
            runs.append(_row(f"{step} batch", f"{step}.batch_id", saved["batch_id"]))
    return (
        f'<div class="grid">{_card("Lag", LAG, current, offset)}'
        f"{_card(f'Retained source log ({measured})', RETAINED, {**current, 'source': source}, verdict)}"
        f"{_card('Snapshot', SNAPSHOT, {'snapshot': {**snap, 'State': state}}, scanned)}"
        f'<div class="card"><h3>Last runs</h3><table>{"".join(runs)}</table></div></div>'
    )


def _pipeline(item: dict[str, Any], now: float, link_dag: bool) -> str:
    where = escape(f"DAG {item['dag_id']}, task {item['task_id']}")
    if link_dag:  # from the nav page to the DAG's own CDC tab, in the whole window
        where = f'<a target="_top" href="../dags/{escape(item["dag_id"])}/plugin/cdc-dag">{where}</a>'
    name = " · ".join(escape(str(n)) for n in (item.get("connector"), item.get("partition")) if n)
    if "error" in item:
        body = f'<p class="bad" data-metric="error">{escape(item["error"])}</p>'
    else:
        error = item["metrics"].get("live_error")
        unreached = f" · source not reached: {escape(error)}" if error else ""
        updated = escape(str(item.get("updated_at") or "never"))
        body = f'<p class="note">state updated {updated}{unreached}</p>{_cards(item, now)}'
    attrs = " ".join(
        f'data-{k}="{escape(str(item.get(k) or ""))}"' for k in ("dag_id", "connector", "partition")
    )
    return f'<section class="pipeline" {attrs}><h2>{name} <small>{where}</small></h2>{body}</section>'


def render(title: str, result: dict[str, Any], link_dag: bool = False) -> str:
    """The page for ``result`` (:func:`~airflow_cdc.airflow.ui.pipelines.dag_documents`)."""
    now, live = time.time(), result["live"]
    toggle = '<a href="?live=0">saved values only</a>' if live else '<a href="?live=1">read the sources</a>'
    intro = (
        f"<p class=note><code>airflow-cdc status --json</code> at {_when(result['generated_at'], now)}, "
        f"{'with' if live else 'without'} a live read of each source (reused for "
        f"{result['ttl_seconds']:.0f} s; the page reloads every {REFRESH_SECONDS} s) · {toggle}</p>"
    )
    sections = "".join(_pipeline(item, now, link_dag) for item in result["pipelines"])
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}"><style>{_CSS}</style></head>'
        f"<body><h1>{escape(title)}</h1>{intro}"
        f"{sections or '<p>No CDC capture task: this DAG runs no airflow-cdc pipeline.</p>'}</body></html>"
    )
