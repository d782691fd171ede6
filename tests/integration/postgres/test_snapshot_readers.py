"""Snapshot readers side by side (snapshot.max.threads) on a real server: a column added or
dropped while the run's readers open their connections."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from airflow_cdc.sources.postgres.source import PostgresSource
from tests.integration.postgres.support import pipeline, run_capture, source_rows
from tests.support.pipeline import assert_rows_equal, replay, snapshot_pending


def _table(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, a text, b numeric, c date)")
        conn.execute(
            f"INSERT INTO {name} SELECT g, 'a' || g, g * 1.5, date '2000-01-01' + g FROM generate_series(1, 3000) g"
        )


def _ddl_when_readers_open(monkeypatch: Any, dsn: str, statement: str) -> list[int]:
    """Run ``statement`` once, when the first reader of a run opens: after the capture's connection
    read the table's columns, before any reader did."""
    opened: list[int] = []
    original, lock = PostgresSource.snapshot_reader, threading.Lock()

    def reader(self: PostgresSource) -> PostgresSource:
        with lock:  # the other reader opens after the statement
            if not opened:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute("SET lock_timeout = '10s'")
                    conn.execute(statement)
            opened.append(1)
        return original(self)

    monkeypatch.setattr(PostgresSource, "snapshot_reader", reader)
    return opened


@pytest.mark.parametrize(
    "statement",
    ["ALTER TABLE {} ADD COLUMN d text", "ALTER TABLE {} ADD COLUMN d int, DROP COLUMN a"],
    ids=["column-added", "column-added-and-dropped"],
)
def test_readers_read_the_columns_the_run_captures(
    pg_db: Any, tmp_path: Any, monkeypatch: Any, statement: str
) -> None:
    """Readers use the capture's view of the table: a column added after the run read the catalog is
    not in this run's chunks (the rows are staged in the run's column order, not shifted); a dropped
    one fails the run by name, and the next run, with the new columns, converges."""
    table = "wide_dropped" if "DROP" in statement else "wide_added"
    _table(pg_db.dsn, table)
    config = pipeline(
        pg_db,
        tmp_path / "staging",
        **{
            "incremental.snapshot.chunk.size": 500,
            "snapshot.max.rows.per.run": 2000,
            "snapshot.max.threads": 2,
            "table.include.list": f"public.{table}",
            "slot.name": f"slot_{table}",
            "publication.name": f"pub_{table}",
            "name": table,
        },
    )
    opened = _ddl_when_readers_open(monkeypatch, pg_db.dsn, statement.format(table))
    dropped = "DROP COLUMN" in statement
    if dropped:
        with pytest.raises(psycopg.errors.UndefinedColumn, match='"a"'):
            run_capture(config)
    else:
        run_capture(config)
    assert len(opened) == 2
    runs = 0
    while snapshot_pending(config):
        run_capture(config)
        runs += 1
        assert runs < 10
    run_capture(config)
    # ADD / DROP COLUMN write no row events: rows staged before read the new column as NULL
    assert_rows_equal(
        table, source_rows(config, f"public.{table}"), replay(config).rows(f"public.{table}"), True
    )
