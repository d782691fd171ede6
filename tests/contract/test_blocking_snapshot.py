"""Blocking snapshots (``execute-snapshot`` with ``"type": "blocking"``) on the sources that read a
table whole at an exact log position (PostgreSQL, MariaDB): the run that meets the signal reads
the table whole once, queues nothing, keeps deleted rows deleted, filters by
``additional-conditions``; with writers running and captures SIGKILLed at random points, exactly
one committed batch holds the read (the one holding the signal row) and the replay equals the
source row by row."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_config, build_store
from tests.contract.harness import DB_FIXTURES, HARNESSES, Harness
from tests.contract.harness_sqlserver import SqlServerHarness
from tests.support.pipeline import CrashRuns, WriterThreads, capture_process, run_capture, snapshot_pending

pytestmark = pytest.mark.integration

#: the sources with a whole-table reader (every PostgreSQL major shares the default's code path)
SOURCES = ["mariadb", "postgresql"]


@pytest.fixture(params=SOURCES)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
    db = request.getfixturevalue(DB_FIXTURES[request.param])
    return HARNESSES[request.param](db, tmp_path / "staging")


def _setup(h: Harness, rows: int, **props: object) -> dict:
    h.execute(
        f"CREATE TABLE {h.q('bk')} (id int PRIMARY KEY, v varchar(40), n int)",
        f"CREATE TABLE {h.q('dbz_signal')} (id varchar(64) PRIMARY KEY, type varchar(32), data varchar(2048))",
    )
    _insert(h, range(1, rows + 1))
    return h.config(
        **{"table.include.list": f"{h.table('bk')},{h.table('dbz_signal')}",
           "signal.data.collection": h.table("dbz_signal"), "incremental.snapshot.chunk.size": 50,
           "snapshot.max.rows.per.run": 200, **props}
    )  # fmt: skip


def _insert(h: Harness, ids: range | list[int]) -> None:
    values = ", ".join(f"({i}, 'v{i}', {i % 5})" for i in ids)
    if values:
        h.execute(f"INSERT INTO {h.q('bk')} (id, v, n) VALUES {values}")


def _signal(h: Harness, sig_id: str, data: dict) -> None:
    h.execute(
        f"INSERT INTO {h.q('dbz_signal')} VALUES ('{sig_id}', 'execute-snapshot', '{json.dumps(data)}')"
    )


def _blocking(h: Harness, **more: object) -> dict:
    return {"data-collections": [h.table("bk")], "type": "blocking", **more}


def _reads(config: dict, table: str) -> dict[str, tuple[int, bool]]:
    """Per staged batch: its ``op=r`` rows of ``table`` and whether it holds a signal row."""
    out = {}
    signals = config["signal.data.collection"]
    for batch in list_batches(config["staging.path"], config["name"]):
        reads = sum(
            sum(op == "r" for op in rb.column("op").to_pylist())
            for rb in (batch.iter_events(table) if table in batch.tables() else [])
        )
        out[batch.batch_id] = (reads, signals in batch.tables())
    return out


def _committed(config: dict) -> str | None:
    stored = build_store(build_config(config)).load(config["name"])
    return None if stored is None else stored.data.get("last_batch")


def test_blocking_signal_reads_the_table_whole_once(harness: Harness) -> None:
    h = harness
    config = _setup(h, 40)
    bk = h.table("bk")
    while snapshot_pending(config):
        run_capture(config)
    h.execute(f"DELETE FROM {h.q('bk')} WHERE id = 3", f"UPDATE {h.q('bk')} SET v = 'changed' WHERE id = 4")
    _signal(h, "b-1", _blocking(h))
    _insert(h, [100])  # after the signal: in the rows read, and as an event the rows do not repeat
    result = run_capture(config)
    assert any(f"blocking snapshot of {bk} complete: 40 rows" in n for n in result.notes), result.notes
    assert result.tables[bk]["r"] == 40 and result.snapshot_rows == 40
    stored = build_store(build_config(config)).load(config["name"])
    assert stored.data["snapshot"]["pending"] == []  # nothing queued: done in the run
    again = run_capture(config)  # the signal lies behind the committed offset: never read again
    assert again.snapshot_rows == 0
    h.assert_converged(config, [bk])
    # a run signal with a filter: only the matching rows are re-read, the others stay as they are
    filtered = run_capture(
        config, signals=[{"execute-snapshot": _blocking(h, **{"additional-conditions": [
            {"data-collection": bk, "filter": "n = 1"}]})}]
    )  # fmt: skip
    assert filtered.snapshot_rows == 8, filtered.notes  # ids 1, 6, ..., 36 (id 100 has n = 0)
    h.assert_converged(config, [bk])


class _Writers(WriterThreads):
    """Threads inserting, updating and deleting rows of ``bk`` (each thread its own new ids)."""

    def __init__(self, h: Harness, n: int = 2) -> None:
        super().__init__()
        self.threads = [threading.Thread(target=self._write, args=(h, i), daemon=True) for i in range(n)]

    def _write(self, h: Harness, i: int) -> None:
        rng, fresh = random.Random(i), 10_000 * (i + 1)
        while not self.stop.is_set():
            k = rng.randint(1, 400)
            try:
                match rng.randrange(3):
                    case 0:
                        fresh += 1
                        _insert(h, [fresh])
                    case 1:
                        h.execute(
                            f"UPDATE {h.q('bk')} SET v = 'u{rng.random():.6f}', n = n + 1 WHERE id = {k}"
                        )
                    case _:
                        h.execute(f"DELETE FROM {h.q('bk')} WHERE id = {k}")
            except Exception:  # noqa: BLE001 - a lock conflict between the writers: try the next one
                pass
            time.sleep(rng.random() * 0.004)


@pytest.mark.slow
def test_blocking_snapshot_converges_with_sigkills(harness: Harness, tmp_path: Path) -> None:
    """After the signal row: a run killed mid-read, one killed after publishing its batch (not
    committed), one killed right after its commit (source not acknowledged) -- then runs killed at
    random points.  The read is redone until a batch holding it is committed, never after."""
    h = harness
    config = _setup(h, 400)
    bk = h.table("bk")
    config_path = tmp_path / "pipeline.json"
    config_path.write_text(json.dumps(config))
    failpoints = "after_batch_write:0.25,after_state_commit:0.25,mid_window:0.1,whole_read:0.5"
    runs = CrashRuns(config_path, failpoints, random.Random(11), 0.4, 1.0, budget=10)
    committed: list[str] = []
    with _Writers(h):
        while snapshot_pending(config) or runs.clean < 2:
            runs.run()
        before = _committed(config)
        _signal(h, "b-crash", _blocking(h))
        for forced in ("whole_read:1", "after_batch_write:1", "after_state_commit:1"):
            kills = runs.kills
            runs.wait(capture_process(config_path, forced))
            assert runs.kills == kills + 1, f"{forced}: the run was not killed"
            committed.append(_committed(config) or "")
        assert committed[:2] == [before, before] and committed[2] != before
        while runs.clean < 6:
            runs.run()
            committed.append(_committed(config) or "")
    run_capture(config)
    committed.append(_committed(config) or "")
    h.assert_converged(config, [bk])
    reads = _reads(config, bk)
    after = dict.fromkeys(c for c in committed if c != before)
    holding = [b for b in after if reads[b][0]]
    assert len(holding) == 1, f"committed batches with op=r rows after the signal: {holding} ({reads})"
    assert reads[holding[0]][1], "the read is not in the batch holding the signal row"
    orphans = [b for b, (n, signal) in reads.items() if n and signal and b not in after]
    assert len(orphans) == 1, f"the batch published but not committed was not staged: {reads}"


def test_blocking_is_refused_where_no_exact_whole_read_exists(mssql_contract_db, tmp_path: Path) -> None:
    """SQL Server: a run signal fails before anything is stored; a signal-table row is skipped with
    a note (the pipeline goes on); both name the type and the alternative, none runs incremental."""
    h = SqlServerHarness(mssql_contract_db, tmp_path / "staging")
    h.create_items("bq", 3)
    h.execute(
        f"CREATE TABLE {h.q('dbz_signal')} (id varchar(64) PRIMARY KEY, type varchar(32), data varchar(2048))"
    )
    config = h.config(
        **{"table.include.list": f"{h.table('bq')},{h.table('dbz_signal')}",
           "signal.data.collection": h.staged(h.table("dbz_signal"))}
    )  # fmt: skip
    blocking = {"execute-snapshot": {"data-collections": [h.table("bq")], "type": "blocking"}}
    with pytest.raises(ConfigError, match="'blocking' is not supported: the sqlserver source") as e:
        run_capture(config, signals=[blocking])
    assert "incremental" in e.value.hint
    assert build_store(build_config(config)).load(config["name"]) is None  # nothing stored
    while snapshot_pending(config):
        run_capture(config)
    data = json.dumps({"data-collections": h.table("bq"), "type": "blocking"})
    h.execute(f"INSERT INTO {h.q('dbz_signal')} VALUES ('b-1', 'execute-snapshot', '{data}')")
    result = run_capture(config)
    assert any("'b-1'" in n and "ignored" in n and "'blocking' is not supported" in n for n in result.notes)
    assert result.snapshot_rows == 0
    assert build_store(build_config(config)).load(config["name"]).data["snapshot"]["pending"] == []
