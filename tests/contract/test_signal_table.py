"""Debezium's signal table (``signal.data.collection``) and table guardrail on every contract source: an
``execute-snapshot`` row inserted during a window starts the snapshot in that window's run (its first
chunks, reconciled by a follow-on window of the same run, as Debezium starts it at the signal), a
``stop-snapshot`` row stops it, a
malformed row is skipped with a note (the pipeline goes on), and the replay converges."""

from __future__ import annotations

import json

import pytest

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_config, build_store
from tests.contract.harness import HARNESSES, Harness
from tests.contract.shared import harness_over, staged_table
from tests.support.pipeline import replay, run_capture, snapshot_pending

pytestmark = pytest.mark.integration
harness = harness_over(sorted(HARNESSES))


def _signal(h: Harness, sig_id: str, kind: str, data: str) -> None:
    if h.name == "sqlserver":  # the emulator harness rewrites [..] as a T-SQL identifier: a list as text
        doc = json.loads(data) if data.startswith("{") else None
        if doc and isinstance(doc.get("data-collections"), list):
            data = json.dumps({**doc, "data-collections": ",".join(doc["data-collections"])})
    h.execute(f"INSERT INTO {h.q('dbz_signal')} VALUES ('{sig_id}', '{kind}', '{data}')")


def _pending(config) -> list[dict]:
    return build_store(build_config(config)).load(config["name"]).data["snapshot"]["pending"]


def test_signal_table_starts_and_stops_snapshots(harness: Harness) -> None:
    h = harness
    h.create_items("si", 25)
    h.execute(f"CREATE TABLE {h.q('dbz_signal')} (id varchar(64) PRIMARY KEY, type varchar(32), data varchar(2048))")
    items, signals = staged_table(h, "si"), staged_table(h, "dbz_signal")
    config = h.config(
        **{"table.include.list": f"{h.table('si')},{h.table('dbz_signal')}", "signal.data.collection": signals,
           "incremental.snapshot.chunk.size": 4, "snapshot.max.rows.per.run": 8}
    )  # fmt: skip
    while snapshot_pending(config):
        run_capture(config)
    h.execute(f"DELETE FROM {h.q('si')} WHERE id = 3", f"UPDATE {h.q('si')} SET v = 'changed' WHERE id = 4")
    _signal(h, "bad-1", "execute-snapshot", "not json")
    _signal(h, "bad-2", "execute-snapshot", json.dumps({"data-collections": ["no.such_table"]}))
    _signal(h, "ok-1", "execute-snapshot", json.dumps({"data-collections": [items], "type": "incremental"}))
    h.insert("si", [100])  # a change in the same window, after the signal
    result = run_capture(config)  # the window holding the signals: the snapshot starts in it
    assert any("'ok-1'" in n and "execute-snapshot: queued" in n for n in result.notes), result.notes
    assert sum("ignored" in n for n in result.notes) == 2
    assert [p["table"] for p in _pending(config)] == [items]
    assert result.snapshot_rows == 8  # its first chunks, reconciled by a follow-on window of this run
    assert result.events >= 6  # the signal rows, the delete, the update, the insert
    first = run_capture(config)
    assert first.snapshot_rows == 8
    _signal(h, "stop-1", "stop-snapshot", json.dumps({"data-collections": [items], "type": "incremental"}))
    stopped = run_capture(config)
    assert any("stop-snapshot: stopped" in n for n in stopped.notes) and _pending(config) == []
    _signal(h, "ok-2", "execute-snapshot", json.dumps({"data-collections": [items]}))
    rows = run_capture(config).snapshot_rows  # the signal's run reads the first chunks
    assert rows == 8
    while snapshot_pending(config):
        rows += run_capture(config).snapshot_rows
    assert rows == 25  # the whole table again (25 - the deleted row + id 100)
    h.assert_converged(config, [h.table("si")])
    assert {k[0] for k in replay(config).rows(signals)} == {"bad-1", "bad-2", "ok-1", "stop-1", "ok-2"}


def test_signal_table_must_be_captured(harness: Harness) -> None:
    h = harness
    h.create_items("sj", 3)
    config = h.config(**{"table.include.list": h.table("sj"), "signal.data.collection": "x.not_captured"})
    with pytest.raises(ConfigError, match="signal.data.collection"):
        run_capture(config)
    config = h.config(**{"table.include.list": h.table("sj"), "signal.enabled.channels": "source,kafka"})
    with pytest.raises(ConfigError, match="signal.enabled.channels.*kafka"):
        run_capture(config)


@pytest.mark.parametrize("action", ["warn", "fail"])
def test_guardrail_on_captured_tables(harness: Harness, action: str) -> None:
    h = harness
    for name in ("g1", "g2", "g3"):
        h.create_items(name, 1)
    tables = ",".join(h.table(n) for n in ("g1", "g2", "g3"))
    config = h.config(**{"table.include.list": tables, "guardrail.collections.max": 2,
                         "guardrail.collections.limit.action": action})  # fmt: skip
    if action == "fail":
        with pytest.raises(ConfigError, match=r"captures 3 tables, more than guardrail.collections.max=2"):
            run_capture(config)
        assert build_store(build_config(config)).load(config["name"]) is None  # nothing stored
    else:
        result = run_capture(config)
        assert any("guardrail.collections.max=2" in n for n in result.notes)
        assert result.snapshot_rows == 3
