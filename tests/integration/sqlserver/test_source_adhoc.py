"""Ad hoc incremental snapshots of SQL Server tables from signals: additional conditions and
surrogate keys (repeating values included), like the other sources."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.batch import Batch
from airflow_cdc.core.conditions import RAW_SQL_PROPERTY
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_store
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from tests.integration.sqlserver.test_source_capture import make_config
from tests.support.conditions import (
    ODD,
    ROWS,
    check_conditions_snapshot_matching_rows,
    check_raw_sql_refused_unless_opted_in,
)
from tests.support.pipeline import replay, run_capture


def _events(result: Any, table: str) -> list[dict]:
    batch = Batch(result.batch_path)
    if table not in batch.tables():
        return []
    return [row for rb in batch.iter_events(table) for row in rb.to_pylist()]


def _ids(events: list[dict], op: str, col: str = "id") -> list[Any]:
    return [(e["after"] or e["before"])[col] for e in events if e["op"] == op]


def _pending(config: Any) -> list:
    stored = build_store(config).load(config["name"])
    return stored.data["snapshot"]["pending"] if stored else []


@pytest.fixture
def tables(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path) -> Any:
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.a", [("id", "int"), ("v", "nvarchar(10)"), ("code", "int"), ("opt", "int")],
                     primary_key=["id"], not_null=["code"])
    emu.create_table(mssql_db, "dbo.b", [("id", "int")], primary_key=["id"])
    for t in ("dbo.a", "dbo.b"):
        emu.enable_table(mssql_db, t)
    with emu.pg_connect(mssql_db) as pg:  # code repeats: 30 - id // 3 (descending with id)
        pg.execute("INSERT INTO dbo.a SELECT g, 'x', 30 - g / 3, NULL FROM generate_series(1, 40) g")
        pg.execute("INSERT INTO dbo.b SELECT generate_series(1, 5)")
    emu.run_capture_job(mssql_db)
    config = make_config(emu, mssql_db, tmp_path, **{"snapshot.mode": "no_data", "incremental.snapshot.chunk.size": 4,
                                                     "snapshot.max.rows.per.run": 9})
    assert run_capture(config).snapshot_rows == 0
    return config


def test_adhoc_snapshot_with_additional_condition(tables: Any, sqlserver_emulator: SqlServerCdcEmulator,
                                                  mssql_db: str) -> None:
    a, b = f"{mssql_db}.dbo.a", f"{mssql_db}.dbo.b"
    sig = {"type": "execute-snapshot", "data": {"data-collections": [a], "type": "incremental",
                                                "additional-conditions": [{"data-collection": a, "filter": "id IN (10, 20, 30, 40)"}]}}
    with sqlserver_emulator.pg_connect(mssql_db) as pg:
        pg.execute("UPDATE dbo.a SET v = 'y' WHERE id = 3")
    sqlserver_emulator.run_capture_job(mssql_db)
    result = run_capture(tables, signals=[sig])
    events = _events(result, a)
    assert sorted(_ids(events, "r")) == [10, 20, 30, 40] and _ids(events, "u") == [3]
    assert _events(result, b) == [] and _pending(tables) == []
    rows = replay(tables).rows(a)
    assert sorted(k[0] for k in rows) == [3, 10, 20, 30, 40]


def test_adhoc_snapshot_surrogate_key_with_repeating_values_over_several_runs(tables: Any, mssql_db: str) -> None:
    a = f"{mssql_db}.dbo.a"
    sig = {"type": "execute-snapshot", "data": {"data-collections": [a], "surrogate-key": "code"}}
    results = [run_capture(tables, signals=[sig])]
    for _ in range(10):
        if not _pending(tables):
            break
        results.append(run_capture(tables))
    assert _pending(tables) == [] and len(results) >= 4  # 40 rows, about 9 per run
    per_run = [_ids(_events(r, a), "r", "code") for r in results]
    codes = [c for run in per_run for c in run]
    assert sorted(_ids([e for r in results for e in _events(r, a)], "r")) == list(range(1, 41))  # each row once
    assert codes == sorted(codes)  # chunked in surrogate-key order
    for earlier, later in zip(per_run, per_run[1:], strict=False):
        if earlier and later:
            assert earlier[-1] < later[0], "a run of equal surrogate values straddles two runs"


@pytest.mark.parametrize(("column", "message"), [("opt", "allows NULLs"), ("nope", "is not a captured column")])
def test_bad_surrogate_key_is_an_error_naming_it(tables: Any, mssql_db: str, column: str, message: str) -> None:
    a = f"{mssql_db}.dbo.a"
    stored = build_store(tables).load(tables["name"])
    sig = {"type": "execute-snapshot", "data": {"data-collections": [a], "surrogate-key": column}}
    with pytest.raises(ConfigError, match=f"surrogate-key '{column}' {message}"):
        run_capture(tables, signals=[sig])
    assert build_store(tables).load(tables["name"]).data["offset"] == stored.data["offset"]  # nothing moved


@pytest.fixture
def odd_table(sqlserver_emulator: SqlServerCdcEmulator, mssql_db: str, tmp_path: Path) -> Any:
    emu = sqlserver_emulator
    emu.create_table(mssql_db, "dbo.t", [("id", "int"), ("status", "nvarchar(20)"), ("amount", "decimal(10,2)"),
                                         (ODD, "int")], primary_key=["id"])
    emu.enable_table(mssql_db, "dbo.t")
    with emu.pg_connect(mssql_db) as pg, pg.cursor() as cur:
        cur.executemany("INSERT INTO dbo.t VALUES (%s, %s, %s, %s)", ROWS)
    emu.run_capture_job(mssql_db)
    return mssql_db


def test_conditions_snapshot_exactly_the_matching_rows_and_raw_sql_needs_the_opt_in(
        sqlserver_emulator: SqlServerCdcEmulator, odd_table: str, tmp_path: Path) -> None:
    props = {"snapshot.mode": "no_data", "incremental.snapshot.chunk.size": 3, "snapshot.max.rows.per.run": 7}
    config = make_config(sqlserver_emulator, odd_table, tmp_path, **props)
    assert run_capture(config).snapshot_rows == 0
    table = f"{odd_table}.dbo.t"
    check_conditions_snapshot_matching_rows(config, table)
    opted = make_config(sqlserver_emulator, odd_table, tmp_path, **props, **{RAW_SQL_PROPERTY: True})
    check_raw_sql_refused_unless_opted_in(config, opted, table, "id % 10 = 0")
