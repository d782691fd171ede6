"""The MariaDB convergence scenario replayed through the Spark apply job: silver equals the source
on every column, with natural Spark types for every MySQL type, and equals the reference applier;
``verify`` agrees, then names the keys of changes that were never captured.

Kept economical (each table of each batch costs Spark seconds): a few thousand rows, a snapshot
over a few runs, every batch applied once, and the composite-key table of the capture scenario
left out (its writers still run; the PostgreSQL replay covers such keys in Spark).
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from airflow_cdc.apply.verify import verify
from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.pipeline import build_config
from spark_jobs.cdc_apply.layout import table_path
from tests.integration.mysql.support import execute, pipeline, replay, run_capture, source_rows
from tests.integration.mysql.test_convergence import ALTERS, ODD_NAME, Writers, schema
from tests.integration.mysql.test_event_shape import TYPES_DDL, TYPES_INSERT
from tests.integration.spark.support import apply_backlog, diff, normalised_rows, semantic_names, silver_rows
from tests.support.pipeline import snapshot_pending

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROWS, ODD_ROWS, TYPED_ROWS = 3_000, 400, 300
# every column of TYPES_DDL (table v), varied per row; row 1 (TYPES_INSERT) holds the extremes
TYPED_FILL = f"""INSERT INTO v SELECT seq + 1, seq % 128 - 64, seq % 256, seq % 2, seq - 500, seq * 200,
    seq * -7777, seq * 1000003, seq * -1234567891, 18446744073709551615 - seq * 999999937, seq / 3, seq / 7,
    seq * 1.0001, seq * -1234567890123456789012345678.0123456789, '2000-01-01' + INTERVAL seq DAY,
    '2001-02-03 04:05:06.789' + INTERVAL seq MINUTE, '2001-02-03 04:05:06.123456' + INTERVAL seq * 7 SECOND,
    '2018-06-20 13:13:16.945104' + INTERVAL seq HOUR, IF(seq % 5 = 0, NULL, '2019-01-01' + INTERVAL seq MINUTE),
    sec_to_time(seq * 9777 - 1500000), maketime(seq % 24, seq % 60, seq % 60 + 0.123456), 1901 + seq % 255,
    left(md5(seq), 5), concat('héllo ', seq), repeat('t', seq), unhex(lpad(hex(seq), 4, '0')),
    left(unhex(md5(seq)), 10), unhex(repeat(md5(seq), 3)), elt(1 + seq % 3, 'small', 'medium', 'large'),
    elt(1 + seq % 4, '', 'a', 'b,c', 'a,b,c'), seq % 2, seq % 1024, json_object('n', seq, 'a', json_array(seq, 'x')),
    IF(seq % 3 = 0, ST_GeomFromText(concat('LINESTRING(0 0, ', seq, ' 1)'), 4326),
       ST_PointFromText(concat('POINT(', seq, ' ', -seq, ')'))),
    '2000-01-01' + INTERVAL seq DAY, IF(seq % 2, NULL, '1999-12-31 23:59:59' + INTERVAL seq SECOND)
    FROM (SELECT CAST(seq AS SIGNED) AS seq FROM seq_1_to_{TYPED_ROWS}) AS s"""
# silver column types (Spark simpleString) per MySQL type
TYPED_SILVER = {
    "id": "int", "ti": "smallint", "tu": "smallint", "t1": "smallint", "si": "int", "su": "int",
    "mi": "int", "iu": "bigint", "bi": "bigint", "bu": "decimal(20,0)", "fl": "float", "db": "double",
    "dc": "decimal(12,4)", "dz": "string", "dt": "date", "dt3": "timestamp_ntz", "dt6": "timestamp_ntz",
    "ts": "timestamp", "ts0": "timestamp", "tm": "string", "tm6": "string", "yr": "int", "ch": "string",
    "vc": "string", "bn": "binary", "vb": "binary", "bl": "binary", "en": "string", "st": "string",
    "b1": "boolean", "b10": "binary", "js": "string", "g": "struct<wkb:binary,srid:int>", "zd": "date",
    "zdt": "timestamp_ntz", "added": "string",
}  # fmt: skip
TYPED_CHANGES = [
    """UPDATE v SET tm = '-01:02:03', tm6 = '838:59:58.999999', bu = bu - 1, dz = -dz, yr = 2155, en = 'large',
       st = 'c', b10 = b'1111111111', g = ST_PointFromText('POINT(9 9)'), js = json_object('u', id),
       ts0 = '2037-12-31 23:59:59' WHERE id % 10 = {n} AND id > 1""",
    "DELETE FROM v WHERE id % 17 = {n} AND id > 1",
    "UPDATE v SET id = id + 100000 WHERE id = 20 + {n}",
]
TYPED_ALTERS = [
    "ALTER TABLE v ADD COLUMN added decimal(50,20) NULL AFTER id",
    "ALTER TABLE v MODIFY si int",
    "ALTER TABLE v DROP COLUMN tx",
]


def _typed_changes(db: Any, n: int) -> None:
    """Changes to the typed table after the first two runs only: fewer batches to apply carry it."""
    if n == 0:
        execute(db, *(s.format(n=n) for s in TYPED_CHANGES), TYPED_ALTERS[0])
    elif n == 1:
        execute(db, TYPED_ALTERS[1], *(s.format(n=n) for s in TYPED_CHANGES), TYPED_ALTERS[2])
        execute(db, "UPDATE v SET added = -id * 12345678901234567890.0123456789 WHERE id % 3 = 0")


def _capture_scenario(db: Any, tmp_path: Any) -> tuple[dict[str, Any], dict[str, list[str]]]:
    execute(db, *schema(ROWS, ODD_ROWS), TYPES_DDL, TYPES_INSERT, TYPED_FILL)
    config = pipeline(
        db,
        tmp_path / "staging",
        **{
            "incremental.snapshot.chunk.size": 600,
            "snapshot.max.rows.per.run": 2_000,
            "table.exclude.list": re.escape(f"{db.name}.{ODD_NAME}"),
        },
    )
    runs = 0
    with Writers(db, rows=ROWS):  # two writers, and ALTER TABLE items every 1.5 s during windows
        while snapshot_pending(config) or runs < 2:
            run_capture(config)
            _typed_changes(db, runs)
            runs += 1
            assert runs < 20, "snapshot did not finish"
            if runs == 1:
                execute(db, ALTERS[5])  # between windows
            time.sleep(1.0)
    run_capture(config)
    assert runs >= 2, "the snapshot should be spread over several runs"
    return config, {f"{db.name}.items": ["id"], f"{db.name}.v": ["id"]}


def _assert_silver_equals_source(spark: Any, config: dict, target: str, table: str, keys: list[str]) -> None:
    """Silver == source == reference applier on the source's current columns (``DROP COLUMN``
    writes no row events: silver keeps the column with the values it had)."""
    names = semantic_names(config, table)
    expected = normalised_rows(source_rows(config, table), names)
    got = silver_rows(spark, target, config, table, keys)
    columns = set(next(iter(expected.values())))
    got = {k: {c: v for c, v in row.items() if c in columns} for k, row in got.items()}
    assert not (problem := diff(expected, got)), f"{table}: silver vs source: {problem}"
    # a replayed row lacks a column added after its last event: NULL, as in silver
    oracle = {
        k: {c: row.get(c) for c in columns}
        for k, row in normalised_rows(replay(config).rows(table), names).items()
    }
    assert not (problem := diff(oracle, got)), f"{table}: silver vs reference applier: {problem}"


def test_mariadb_capture_replayed_through_spark(spark, mariadb_db, tmp_path):
    config, tables = _capture_scenario(mariadb_db, tmp_path)
    batches = list_batches(config["staging.path"], config["name"])
    target = str(tmp_path / "delta")
    apply_backlog(spark, batches, target)
    for table, keys in tables.items():
        _assert_silver_equals_source(spark, config, target, table, keys)
    typed = spark.read.format("delta").load(
        table_path(target, "silver", config["name"], f"{mariadb_db.name}.v")
    )
    types = {f.name: f.dataType.simpleString() for f in typed.schema.fields if not f.name.startswith("__")}
    assert types == {**TYPED_SILVER, "tx": "string"}  # tx: dropped at the source, kept in silver
    row1 = typed.where("id = 1").collect()[0].asDict()
    assert str(row1["bu"]) == "18446744073709551615" and row1["tm"] == "-838:59:59.000000"
    assert row1["dz"] == "123456789012345678901234567890.0123456789"

    report = verify(build_config(config), target, spark=spark, chunk=5_000)
    assert report.ok, report.differences
    assert all(t.source_rows > 0 for t in report.tables) and len(report.tables) == 2
    (a,), (b,), (c,) = sorted(source_rows(config, f"{mariadb_db.name}.items"))[:3]
    execute(
        mariadb_db,
        f"UPDATE items SET qty = qty + 100 WHERE id IN ({a}, {b})",
        f"DELETE FROM items WHERE id = {c}",
        "UPDATE v SET tm = '-00:00:01' WHERE id = 1",
        "INSERT INTO v (id) VALUES (999999)",
    )
    report = verify(build_config(config), target, spark=spark, chunk=5_000)
    items, typed_report = (next(t for t in report.tables if t.table == name) for name in tables)
    assert sorted(items.different) == [[a], [b]] and items.extra == [[c]] and not items.missing
    assert typed_report.different == [[1]] and typed_report.missing == [[999999]]
