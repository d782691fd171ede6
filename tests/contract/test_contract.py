"""The source contract suite: every source runs these tests unchanged (``harness.HARNESSES``).

Each test drives a real server through the source's own dialect and compares the replayed staged
batches with the live tables row by row, on every column (including a TOAST-sized text column).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.errors import OffsetUnavailable
from tests.contract.harness import DB_FIXTURES, HARNESSES, Harness, cold_backup, own_server, restore_backup
from tests.support.pipeline import run_capture

pytestmark = pytest.mark.integration
KINDS = sorted(HARNESSES)


@pytest.fixture(params=KINDS)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    db = request.getfixturevalue(DB_FIXTURES[request.param])
    return HARNESSES[request.param](db, tmp_path / "staging")


def _pending(config: dict[str, Any]) -> bool:
    from airflow_cdc.core.pipeline import build_config, build_store

    stored = build_store(build_config(config)).load(config["name"])
    return stored is None or bool(stored.data["snapshot"]["pending"])


def _snapshot_with_changes(h: Harness, config: dict[str, Any], table: str) -> int:
    """Run captures until the snapshot is done, changing rows of every kind between runs."""
    runs, step = 0, 0
    q = h.q(table)
    while _pending(config) or runs < 2:
        run_capture(config)
        runs += 1
        step += 1
        base = step * 5
        h.execute(
            f"UPDATE {q} SET v = CONCAT(v, '+'), n = n + 1 WHERE id = {base}",  # big unchanged
            f"DELETE FROM {q} WHERE id = {base + 1}",
            f"UPDATE {q} SET id = id + 10000 WHERE id = {base + 2}",  # key change, big unchanged
            f"UPDATE {q} SET big = CONCAT(big, 'x') WHERE id = {base + 3}",
        )
        h.insert(table, [20000 + step])
        assert runs < 40, "snapshot did not finish"
    return runs


def test_snapshot_and_every_op_converge(harness: Harness) -> None:
    h = harness
    h.create_items("items", 60)
    config = h.config(**{"incremental.snapshot.chunk.size": 7, "snapshot.max.rows.per.run": 15})
    runs = _snapshot_with_changes(h, config, "items")
    run_capture(config)
    assert runs >= 4
    oracle = h.assert_converged(config, [h.table("items")])
    assert len(oracle.rows(h.table("items"))) > 40


def test_truncate_converges(harness: Harness) -> None:
    h = harness
    h.create_items("tt", 30)
    config = h.config(**{"skipped.operations": "none", "incremental.snapshot.chunk.size": 8})
    run_capture(config)
    h.execute(f"TRUNCATE TABLE {h.q('tt')}")
    h.insert("tt", range(100, 110))
    while _pending(config):
        run_capture(config)
    run_capture(config)
    h.assert_converged(config, [h.table("tt")])


def test_new_tables_mid_run_are_captured_and_snapshotted(harness: Harness) -> None:
    """Tables that join the captured set after the connector started: one created and filled inside
    a window, one renamed into the filters with rows the log never carried for it."""
    h = harness
    h.create_items("items", 10)
    h.create_items("other", 12)  # not captured yet
    config = h.config(**{"table.include.list": f"{h.table('items')},{h.table('new')}.*"})
    while _pending(config):
        run_capture(config)
    h.execute(h.items_ddl("new_a"))
    h.insert("new_a", range(1, 9))
    h.execute(f"UPDATE {h.q('new_a')} SET v = 'changed' WHERE id = 3")
    h.execute(f"ALTER TABLE {h.q('other')} RENAME TO {h.q('new_b')}")
    run_capture(config)
    h.execute(f"DELETE FROM {h.q('new_b')} WHERE id = 5")
    for _ in range(4):
        run_capture(config)
    assert not _pending(config)
    h.assert_converged(config, [h.table("items"), h.table("new_a"), h.table("new_b")])


@pytest.mark.parametrize("point", ["after_batch_write", "after_state_commit", "mid_window"])
def test_crash_at_every_failpoint(harness: Harness, tmp_path: Path, point: str) -> None:
    h = harness
    h.create_items("items", 40)
    config = h.config(**{"incremental.snapshot.chunk.size": 9, "snapshot.max.rows.per.run": 18})
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(config))
    killed = 0
    for step in range(4):
        h.execute(f"UPDATE {h.q('items')} SET n = n + 1 WHERE id <= {step * 10 + 5}")
        proc = subprocess.run(
            [sys.executable, "-m", "airflow_cdc.cli", "capture", "--config", str(path), "--commit"],
            env=dict(os.environ, AIRFLOW_CDC_FAILPOINTS=f"{point}:1"),
            capture_output=True,
            timeout=300,
        )
        if proc.returncode == -signal.SIGKILL:
            killed += 1
        else:
            assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert killed, f"failpoint {point} never fired"
    while _pending(config):
        run_capture(config)
    run_capture(config)
    h.assert_converged(config, [h.table("items")])


def test_lost_offset_is_an_error_unless_when_needed(harness: Harness) -> None:
    h = harness
    h.create_items("items", 20)
    config = h.config()
    while _pending(config):
        run_capture(config)
    before = _offset(config)
    h.execute(f"UPDATE {h.q('items')} SET n = 99 WHERE id = 1")
    h.make_offset_unreadable(config)
    with pytest.raises(OffsetUnavailable):
        run_capture(config)
    assert _offset(config) == before, "a failed run moved the offset"
    h.execute(f"DELETE FROM {h.q('items')} WHERE id = 2")
    config = dict(config, **{"snapshot.mode": "when_needed"})
    while _pending(config) or _offset(config) == before:
        run_capture(config)
    run_capture(config)
    h.assert_converged(config, [h.table("items")])


def _offset(config: dict[str, Any]) -> dict[str, Any]:
    from airflow_cdc.core.pipeline import build_config, build_store

    stored = build_store(build_config(config)).load(config["name"])
    assert stored is not None
    return dict(stored.data["offset"])


RESTORE_CASES = [
    pytest.param(kind, writes, id=f"{kind}-{'writes-first' if writes else 'capture-first'}",
                 marks=[pytest.mark.xfail(strict=True, reason=(
                     "known gap: MariaDB GTIDs carry no server UUID, so a restored server reuses the "
                     "captured sequence numbers for new transactions and looks like a failover that "
                     "kept every captured GTID (README: limitations)"))] if (kind, writes) == ("mariadb", True)
                 else [])
    for kind in KINDS for writes in (False, True)
]  # fmt: skip


@pytest.mark.parametrize(("kind", "writes_first"), RESTORE_CASES)
def test_restore_with_lower_positions(kind: str, writes_first: bool, tmp_path: Path) -> None:
    """The server is restored from a cold backup: its log restarts below the stored offset.  Without
    ``when_needed`` that is a lost offset; with it, a re-snapshot in a new position epoch makes the
    new events win over everything captured before the restore, and its completion voids the rows
    captured before (here: rows deleted after the backup come back, rows inserted are gone)."""
    with own_server(kind) as db:
        h = HARNESSES[kind](db, tmp_path / "staging")
        h.create_items("items", 30)
        config = h.config(**{"incremental.snapshot.chunk.size": 10})
        while _pending(config):
            run_capture(config)
        backup = cold_backup(db.server)
        h.execute(f"UPDATE {h.q('items')} SET v = 'after backup' WHERE id <= 10")
        h.execute(f"DELETE FROM {h.q('items')} WHERE id > 25")
        h.insert("items", [40, 41])
        run_capture(config)
        captured = _offset(config)
        restore_backup(db.server, backup)

        def restored_writes() -> None:
            h.execute(f"UPDATE {h.q('items')} SET v = 'restored', n = -1 WHERE id IN (3, 4)")
            h.execute(f"DELETE FROM {h.q('items')} WHERE id = 5")

        if writes_first:
            restored_writes()
            for i in range(7, 11):  # more transactions than were captured after the backup
                h.execute(f"UPDATE {h.q('items')} SET n = n + 100 WHERE id = {i}")
        with pytest.raises(OffsetUnavailable):
            run_capture(config)
        assert _offset(config) == captured
        if not writes_first:
            restored_writes()
        config = dict(config, **{"snapshot.mode": "when_needed"})
        run_capture(config)
        assert _offset(config)["epoch"] == captured.get("epoch", 0) + 1
        h.execute(f"UPDATE {h.q('items')} SET v = 'later' WHERE id = 6")
        while _pending(config):
            run_capture(config)
        run_capture(config)
        h.assert_converged(config, [h.table("items")])
