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
import time
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


def test_first_run_killed_after_publishing_keeps_its_start(harness: Harness, tmp_path: Path) -> None:
    """A first run (no stored offset) SIGKILLed after publishing its batch, then deletes and
    updates of rows that batch snapshotted: the next run must start where the killed one did (the
    start is stored before any batch), or the orphaned batch's rows of deleted keys stay in silver
    (they are only superseded by events after their position) -- the SQL Server convergence test
    once found it.  The orphaned batch is replayed too, as an apply before a failed commit would."""
    h = harness
    h.create_items("items", 30)
    config = h.config(**{"incremental.snapshot.chunk.size": 10, "snapshot.max.rows.per.run": 10})
    path = tmp_path / "pipeline.json"
    path.write_text(json.dumps(config))
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_cdc.cli", "capture", "--config", str(path), "--commit"],
        env=dict(os.environ, AIRFLOW_CDC_FAILPOINTS="after_batch_write:1"),
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    q = h.q("items")
    h.execute(f"DELETE FROM {q} WHERE id IN (2, 5)", f"UPDATE {q} SET n = n + 7 WHERE id IN (3, 6)")
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


# -- concurrent runs -------------------------------------------------------------------------------
_STUCK_HOLDER = """
import json, pathlib, sys, time
from airflow_cdc.core.pipeline import build_capture

config, ready = sys.argv[1], pathlib.Path(sys.argv[2])
capture = build_capture(json.loads(pathlib.Path(config).read_text()))

def stuck(*args, **kwargs):  # the run holds the lease and its in-progress batch, mid-window
    ready.write_text("stuck")
    time.sleep(600)

capture.source.read_window = stuck
capture.run(commit=True)
"""


def _tree(path: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*")}


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from airflow_cdc.cli import main

    code = main(args)
    return code, capsys.readouterr().err


def test_concurrent_runs_are_refused(
    harness: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a capture holds the connector's lease (stuck mid-window), a second capture, an apply
    and a commit are refused with a retryable error naming the holder, and the holder's in-progress
    batch is untouched; once the holder is SIGKILLed a new run takes over, removes its leftovers and
    the replay still equals the source.  A holder that died on another host (not provably dead)
    blocks runs until its lease expires (``lease.timeout.ms``)."""
    from airflow_cdc.core.batch import Batch, batches_root
    from airflow_cdc.core.errors import LeaseHeld
    from airflow_cdc.core.pipeline import build_capture

    h = harness
    h.create_items("items", 20)
    config = h.config(**{"lease.timeout.ms": 1500})
    while _pending(config):
        run_capture(config)
    h.execute(f"UPDATE {h.q('items')} SET n = n + 1 WHERE id <= 5")
    staged = run_capture(config, commit=False)  # published, not committed: the commit to refuse
    offset = _offset(config)
    path, ready = tmp_path / "pipeline.json", tmp_path / "ready"
    path.write_text(json.dumps(config))
    holder = subprocess.Popen([sys.executable, "-c", _STUCK_HOLDER, str(path), str(ready)],
                              stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.poll() is None, holder.stderr.read().decode()[-2000:] if holder.stderr else ""
            assert time.monotonic() < deadline, "the holder never reached its window"
            time.sleep(0.05)
        (inprogress,) = batches_root(config["staging.path"], config["name"]).glob(".inprogress-*")
        before = _tree(inprogress)
        with pytest.raises(LeaseHeld, match=f"pid {holder.pid}"):
            run_capture(config)
        with pytest.raises(LeaseHeld, match=f"pid {holder.pid}"):
            build_capture(config).commit(Batch(staged.batch_path))
        for args in (["capture", "--config", str(path), "--commit"],
                     ["commit", "--config", str(path), "--batch", staged.batch_path],
                     ["apply", "--config", str(path), "--target", str(tmp_path / "delta")]):  # fmt: skip
            code, err = _cli(args, capsys)
            assert code == 75, f"{args[0]}: exit {code}, {err}"
            assert "is busy: its lease is held by capture on host" in err and f"pid {holder.pid}" in err, err
        time.sleep(1.0)  # well past a renewal: the holder keeps its lease while it lives
        with pytest.raises(LeaseHeld):
            run_capture(config)
        assert inprogress.exists() and _tree(inprogress) == before, "the holder's in-progress batch was touched"
        assert _offset(config) == offset
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert holder.returncode == -signal.SIGKILL
    h.execute(f"DELETE FROM {h.q('items')} WHERE id = 6")
    took_over = run_capture(config)  # the dead holder's lease is taken over at once
    assert took_over.committed and took_over.events >= 2
    assert not inprogress.exists(), "the dead holder's in-progress batch was left behind"
    from airflow_cdc.core.errors import StateConflict

    with pytest.raises(StateConflict):  # the batch staged before the holder started is stale now
        build_capture(config).commit(Batch(staged.batch_path))
    from airflow_cdc.core import lease as lease_module

    taken = time.monotonic()
    with monkeypatch.context() as m:  # a run on another worker takes the lease, then that worker dies
        m.setattr(lease_module.socket, "gethostname", lambda: "other-worker")
        ghost = lease_module.acquire(build_capture(config).store, config["name"], "capture", 1.5)
    ghost._stop.set()  # no renewal, no release: only expiry frees it
    h.execute(f"UPDATE {h.q('items')} SET v = 'after expiry' WHERE id = 7")
    with pytest.raises(LeaseHeld, match="other-worker"):
        run_capture(config)
    time.sleep(max(0.0, taken + ghost.timeout + 0.2 - time.monotonic()))
    after = run_capture(config)
    assert after.committed and after.events == 1
    h.assert_converged(config, [h.table("items")])
