"""Blocking snapshots in the run: which sources run them, one read per table and filter, refusals."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_cdc.core import snapshot_blocking
from airflow_cdc.core.snapshot import TableSnapshot
from airflow_cdc.core.source import Capabilities
from airflow_cdc.sources.mysql.source import MySqlSource
from airflow_cdc.sources.postgres.source import PostgresSource
from airflow_cdc.sources.sqlserver.source import SqlServerSource
from airflow_cdc.sources.vitess.source import VitessSource


class FakeSource:
    """Tables named ``k*`` have key columns; ``read_whole`` stages ``rows[table]`` rows."""

    kind = "fake"
    capabilities = Capabilities(blocking_snapshots=True)

    def __init__(self, rows: dict[str, int]) -> None:
        self.rows, self.read = rows, []

    def tables(self) -> list[str]:
        return sorted(self.rows)

    def snapshot_whole(self, table: str) -> bool:
        return not table.startswith("k")

    def read_whole(self, snap, writer) -> int:
        self.read.append((snap.table, snap.condition))
        return self.rows[snap.table]


@pytest.mark.parametrize(
    "source,runs",
    [(PostgresSource, True), (MySqlSource, True), (SqlServerSource, False), (VitessSource, False)],
)
def test_only_sources_with_an_exact_whole_read_run_blocking_snapshots(source, runs):
    reason = snapshot_blocking.refused(SimpleNamespace(kind=source.kind, capabilities=source.capabilities))
    assert (reason is None) == runs
    if not runs:
        assert source.kind in reason and "whole-table read" in reason


def test_read_once_per_table_and_filter_and_count():
    source = FakeSource({"k1": 5, "k2": 3, "a": 4})
    requests = [
        TableSnapshot("k1", "blocking"),
        TableSnapshot("k2", "blocking", "x = 1"),
        TableSnapshot("k1", "blocking"),  # a second signal met in the same run
        TableSnapshot("gone", "blocking"),
        TableSnapshot("a", "blocking", "y = 2"),  # keyless: its image replaces silver, no filter
        TableSnapshot("a", "blocking"),
    ]
    counts, notes = {"k1": 1}, []
    assert snapshot_blocking.read(source, None, requests, counts, notes) == 12
    assert source.read == [("k1", None), ("k2", "x = 1"), ("a", None)]
    assert counts == {"k1": 6, "k2": 3, "a": 4}
    assert any("gone skipped" in n for n in notes)
    assert any("a with additional-conditions refused" in n for n in notes)
    assert any("k2 complete: 3 rows matching 'x = 1'" in n for n in notes)
