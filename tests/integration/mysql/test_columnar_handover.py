"""The columnar hand-over on a real MariaDB binlog stages exactly what the other routes stage.

One window over a table of many types (the ``mysql_capture`` bench's seven first) holding NULLs,
zero dates, two-digit years, extremes, non-UTF-8 bytes in a binary column, inserts logged with
``binlog_row_image=NOBLOB`` and ``MINIMAL`` (partial after images), updates that keep and that
change the key, a TRUNCATE between rows events of the table, and deletes: captured three times
without committing -- the default (column buffers), ``AIRFLOW_CDC_MYSQL_COLUMNAR=0`` (the compiled
decoder's event tuples) and ``AIRFLOW_CDC_MYSQL_ROWS=python`` (the generated readers) -- whose
staged rows must be equal, value by value.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_cdc.sources.mysql import columnar
from airflow_cdc.sources.mysql import rowcodec as rc
from tests.integration.mysql.support import execute, pipeline, run_capture

pytestmark = pytest.mark.skipif(columnar._Columns is None, reason="_binlogrows extension not built")

DDL = """CREATE TABLE wide (
    id BIGINT PRIMARY KEY, qty INT, price DECIMAL(12,2), name VARCHAR(64), at DATETIME(6),
    active TINYINT(1), doc JSON,
    u64 BIGINT UNSIGNED, m24 MEDIUMINT UNSIGNED, s16 SMALLINT, flag BIT(1), bits BIT(10),
    f FLOAT, d DOUBLE, big DECIMAL(38,10), huge DECIMAL(65,30), dt0 DATETIME NOT NULL DEFAULT '2000-01-01',
    day DATE, ts TIMESTAMP(3) NULL, tm TIME(6), yr YEAR, e ENUM('a','b'), st SET('x','y'),
    code CHAR(4) CHARACTER SET latin1, txt TEXT, raw BLOB, vb VARBINARY(16), g POINT
) DEFAULT CHARSET=utf8mb4"""
COLUMNS = (
    "id, qty, price, name, at, active, doc, u64, m24, s16, flag, bits, f, d, big, huge, dt0, day, ts, tm, "
    "yr, e, st, code, txt, raw, vb, g"
)
ROWS = [
    "(1, 5, 12.50, 'plain', '2024-02-29 23:59:59.999999', 1, '{\"a\": [1, 2]}', 18446744073709551615, "
    "16777215, -32768, b'1', b'1010101010', 1.5, -2.25e300, 1234567890123456789012345678.0123456789, "
    "-12345678901234567890123456789012345.123456789012345678901234567890, '0000-00-00 00:00:00', "
    "'2024-01-31', '2038-01-19 03:14:07.499', '-838:59:59.000000', 2155, 'b', 'x,y', 'ÿé', "
    "'€ 😀', x'00FF', x'C328', ST_GeomFromText('POINT(1 2)'))",
    "(2, NULL, -0.01, '', '0000-00-00 00:00:00.000000', 0, NULL, 0, 0, 0, b'0', b'0', -0.0, 0, 0, 0, "
    "'1000-01-01 00:00:00', '0000-00-00', NULL, '00:00:00.000001', 0, NULL, '', NULL, NULL, NULL, '', NULL)",
    "(3, -2147483648, 9999999999.99, 'ümlaut', '0069-12-31 23:59:59.5', NULL, '[]', NULL, NULL, NULL, "
    "NULL, NULL, NULL, NULL, -0.0000000001, NULL, '1970-01-01 00:00:00', '0001-01-01', "
    "'1970-01-01 00:00:01.000', NULL, 1901, 'a', 'y', 'ab', NULL, x'', x'FF', NULL)",
]


def _staged(staging: Path) -> pa.Table:
    files = sorted(staging.rglob("*.parquet"))
    tables = [pq.read_table(f).drop_columns(["ts_ms", "ts_us", "ts_ns"]) for f in files]
    tables = [t for t in tables if "__position" in t.column_names]
    assert tables
    return pa.concat_tables(tables, promote_options="permissive").sort_by("__position")


def _batches(staging: Path) -> None:
    for d in staging.rglob("batches"):
        for b in d.iterdir():
            for f in sorted(b.rglob("*"), reverse=True):
                f.unlink() if f.is_file() else f.rmdir()
            b.rmdir()


def test_three_routes_stage_the_same_rows(mariadb_db, tmp_path, monkeypatch, caplog):
    db = mariadb_db
    caplog.set_level(logging.DEBUG, logger=columnar.__name__)
    staging = tmp_path / "staging"
    config = pipeline(db, staging, snapshot__mode="no_data")
    execute(db, DDL)
    run_capture(config)  # the start of the window
    values = ", ".join(ROWS)
    execute(
        db,
        f"INSERT INTO wide ({COLUMNS}) VALUES {values}",
        "SET SESSION binlog_row_image = 'NOBLOB'",
        "INSERT INTO wide (id, qty, name, doc, txt) VALUES (10, 1, 'noblob', '{}', 'not logged unless set')",
        "SET SESSION binlog_row_image = 'MINIMAL'",
        "INSERT INTO wide (id, name) VALUES (11, 'minimal')",
        "SET SESSION binlog_row_image = 'FULL'",
        "UPDATE wide SET qty = qty + 1, at = NOW(6), doc = JSON_ARRAY(qty) WHERE id IN (1, 2, 10)",
        "UPDATE wide SET id = id + 100, name = CONCAT(name, '!') WHERE id IN (3, 11)",
        "DELETE FROM wide WHERE id = 2",
        "INSERT INTO wide (id, price, at) SELECT seq, seq / 7, '2020-02-02 02:02:02.020202' FROM seq_200_to_900",
        "TRUNCATE TABLE wide",
        f"INSERT INTO wide ({COLUMNS}) VALUES {values}",
        "UPDATE wide SET e = 'a', tm = '12:00', big = big * 2",
        "DELETE FROM wide WHERE id > 1",
    )
    staged = []
    for env, value in ((None, None), (columnar.COLUMNAR_ENV, "0"), (rc.ROWS_ENV, "python")):
        if env:
            monkeypatch.setenv(env, value)
        _batches(staging)
        result = run_capture(config, commit=False)
        if env:
            monkeypatch.delenv(env)
        assert result.events > 700
        if env is None:  # the first route took the column buffers, the bench's seven columns fast
            kinds = [
                r.getMessage() for r in caplog.records if f"{db.name}.wide: column buffers" in r.getMessage()
            ]
            assert kinds, "the columnar hand-over did not run"
            fast = "id=int, qty=int, price=decimal, name=bytes, at=datetime, active=int, doc=bytes"
            assert fast in kinds[0], kinds[0]
        staged.append(_staged(staging))
    assert staged[0].num_rows > 700
    for other in staged[1:]:
        assert staged[0].schema == other.schema
        for name in staged[0].column_names:
            assert staged[0].column(name).to_pylist() == other.column(name).to_pylist(), name
