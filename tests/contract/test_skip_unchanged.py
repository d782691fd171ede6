"""``skip.messages.without.change`` on every SQL source: an update that changes only columns
``column.exclude.list`` drops (or nothing at all) is not staged, every other change is; a dropped
update neither drops the snapshot chunk row it touched nor takes a transaction order; the replay
equals the source on the captured columns.  PostgreSQL's own cases (REPLICA IDENTITY, TOAST, both
decoders) are in ``tests/integration/postgres/test_skip_unchanged.py``."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_cdc.sources.mysql.source import MySqlSource
from airflow_cdc.sources.postgres.source import PostgresSource
from airflow_cdc.sources.sqlserver.source import SqlServerSource
from tests.contract.harness import Harness
from tests.contract.shared import SQL_KINDS, harness_over, staged_events, staged_table
from tests.support.pipeline import replay, run_capture, snapshot_pending

pytestmark = pytest.mark.integration
harness = harness_over(SQL_KINDS)
SOURCES = {"postgresql": PostgresSource, "mariadb": MySqlSource, "sqlserver": SqlServerSource}


def _table(h: Harness, name: str, rows: int = 10) -> dict[str, Any]:
    """A table whose ``secret`` column is not captured; a config that skips unchanged updates."""
    h.execute(f"CREATE TABLE {h.q(name)} (id int PRIMARY KEY, v varchar(40), secret varchar(40), n int)")
    if h.name == "postgresql":  # the seed: the property applies with REPLICA IDENTITY FULL only
        h.execute(f"ALTER TABLE {h.q(name)} REPLICA IDENTITY FULL")
    h.execute(
        f"INSERT INTO {h.q(name)} VALUES " + ", ".join(f"({i}, 'v{i}', 's', {i})" for i in range(1, rows + 1))
    )
    table = h.table(name)
    return h.config(
        **{
            "table.include.list": table,
            "column.exclude.list": f"{table}.secret",
            "skip.messages.without.change": "true",
        }
    )


def _rows(config: dict[str, Any], table: str) -> dict[int, tuple]:
    return {k[0]: (r["v"], r["n"]) for k, r in replay(config).rows(table).items()}


@pytest.mark.parametrize("txn", [False, True], ids=["plain", "transaction-metadata"])
def test_updates_of_uncaptured_columns_are_not_staged(harness: Harness, txn: bool) -> None:
    h, q = harness, harness.q("su")
    config = {**_table(h, "su"), "provide.transaction.metadata": txn, "incremental.snapshot.chunk.size": 3}
    while snapshot_pending(config):
        run_capture(config)
    h.execute(
        f"UPDATE {q} SET secret = 'x' WHERE id = 1",
        f"UPDATE {q} SET v = 'V2' WHERE id = 2",
        f"UPDATE {q} SET secret = 'y', n = 30 WHERE id = 3",
        f"UPDATE {q} SET v = v WHERE id = 4",
        f"UPDATE {q} SET id = 15 WHERE id = 5",
        f"DELETE FROM {q} WHERE id = 6",
        # one transaction: rows 7, 9 and 10 change only the secret, row 8 its value too
        f"UPDATE {q} SET secret = 'z', v = CASE WHEN id = 8 THEN 'V8' ELSE v END WHERE id >= 7",
    )
    run_capture(config)
    events = [e for e in staged_events(config, staged_table(h, "su")) if e["op"] != "r"]
    staged = [(e["op"], (e["after"] or e["before"])["id"]) for e in events]
    assert staged == [("u", 2), ("u", 3), ("d", 5), ("c", 15), ("d", 6), ("u", 8)]
    if txn:  # orders count the staged events only
        last = events[-1]["transaction"]
        assert (last["total_order"], last["data_collection_order"]) == (1, 1)
    expected = {i: (f"v{i}", i) for i in (1, 4, 7, 9, 10)}
    expected |= {2: ("V2", 2), 3: ("v3", 30), 15: ("v5", 5), 8: ("V8", 8)}
    assert _rows(config, staged_table(h, "su")) == expected


def test_dropped_update_keeps_the_chunk_row(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """An update committed after a chunk was read, inside the run's window, that the window drops:
    the chunk row stays (nothing else would bring the row to silver), a kept one still replaces it."""
    h, q = harness, harness.q("sk")
    config = _table(h, "sk")
    cls = SOURCES[h.name]
    read_chunks = cls.read_chunks
    done: list[bool] = []

    def read_then_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        chunks = read_chunks(self, *args, **kwargs)
        if not done:
            done.append(True)
            h.execute(f"UPDATE {q} SET secret = 'x' WHERE id <= 5", f"UPDATE {q} SET v = 'V9' WHERE id = 9")
        return chunks

    monkeypatch.setattr(cls, "read_chunks", read_then_update)
    run_capture(config)
    monkeypatch.undo()
    assert done
    events = staged_events(config, staged_table(h, "sk"))
    assert sorted(e["after"]["id"] for e in events if e["op"] == "r") == [1, 2, 3, 4, 5, 6, 7, 8, 10]
    assert [(e["op"], e["after"]["id"]) for e in events if e["op"] != "r"] == [("u", 9)]
    assert _rows(config, staged_table(h, "sk")) == {i: ("V9" if i == 9 else f"v{i}", i) for i in range(1, 11)}
