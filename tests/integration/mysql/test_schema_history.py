"""Schema history on MariaDB: column reorders, renames, type changes and drop/re-add, inside one
binlog window and across windows, with and without ``binlog_row_metadata=FULL``.  Every staged row
equals the row as written, value by value, or capture stops with a SchemaError naming the table and
the binlog position, the offset unmoved -- never a row decoded with another structure."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from airflow_cdc.core.batch import Batch
from airflow_cdc.core.errors import SchemaError
from tests.integration.mysql.support import execute, pipeline, run_capture, state


def _ms(text: str) -> int:
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp() * 1000)


def _us(text: str) -> int:
    stamp = dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)
    return int(stamp.replace(microsecond=0).timestamp()) * 1_000_000 + stamp.microsecond


# each case: CREATE, then steps: a DDL, or (INSERT, the event's expected ``after``); {t} is the table.
# Every case has two DDLs or more with a row between them: the earlier DDL's structure is not
# what information_schema says once the later one ran.
CASES = {
    "reorder": (
        "CREATE TABLE {t} (id int PRIMARY KEY, a int, b int)",
        [
            ("INSERT INTO {t} (id, a, b) VALUES (1, 10, 20)", {"id": 1, "a": 10, "b": 20}),
            "ALTER TABLE {t} MODIFY b int AFTER id",  # swap of two same-typed columns
            ("INSERT INTO {t} (id, a, b) VALUES (2, 11, 21)", {"id": 2, "b": 21, "a": 11}),
            "ALTER TABLE {t} MODIFY a int FIRST",
            ("INSERT INTO {t} (id, a, b) VALUES (3, 12, 22)", {"a": 12, "id": 3, "b": 22}),
            "ALTER TABLE {t} MODIFY a int AFTER b",
            ("INSERT INTO {t} (id, a, b) VALUES (4, 13, 23)", {"id": 4, "b": 23, "a": 13}),
        ],
    ),
    "rename": (
        "CREATE TABLE {t} (id int PRIMARY KEY, a int, b int)",
        [
            ("INSERT INTO {t} VALUES (1, 10, 20)", {"id": 1, "a": 10, "b": 20}),
            "ALTER TABLE {t} CHANGE a x int",
            ("INSERT INTO {t} VALUES (2, 11, 21)", {"id": 2, "x": 11, "b": 21}),
            "ALTER TABLE {t} RENAME COLUMN b TO a",
            ("INSERT INTO {t} VALUES (3, 12, 22)", {"id": 3, "x": 12, "a": 22}),
        ],
    ),
    "int_bigint": (
        "CREATE TABLE {t} (id int PRIMARY KEY, v int)",
        [
            ("INSERT INTO {t} VALUES (1, -7)", {"id": 1, "v": -7}),
            "ALTER TABLE {t} MODIFY v bigint",
            ("INSERT INTO {t} VALUES (2, -1099511627776)", {"id": 2, "v": -1099511627776}),
            "ALTER TABLE {t} MODIFY v bigint NOT NULL",
            ("INSERT INTO {t} VALUES (3, 5)", {"id": 3, "v": 5}),
        ],
    ),
    "varchar": (
        "CREATE TABLE {t} (id int PRIMARY KEY, v varchar(10))",
        [
            ("INSERT INTO {t} VALUES (1, 'short')", {"id": 1, "v": "short"}),
            "ALTER TABLE {t} MODIFY v varchar(200)",
            ("INSERT INTO {t} VALUES (2, '{long}')", {"id": 2, "v": "é" * 150}),
            "ALTER TABLE {t} MODIFY v varchar(200) CHARACTER SET latin1",
            ("INSERT INTO {t} VALUES (3, 'lätin')", {"id": 3, "v": "lätin"}),
        ],
    ),
    "decimal": (
        "CREATE TABLE {t} (id int PRIMARY KEY, v decimal(5,2))",
        [
            ("INSERT INTO {t} VALUES (1, 123.45)", {"id": 1, "v": Decimal("123.45")}),
            "ALTER TABLE {t} MODIFY v decimal(12,4)",
            ("INSERT INTO {t} VALUES (2, 12345678.1234)", {"id": 2, "v": Decimal("12345678.1234")}),
            "ALTER TABLE {t} MODIFY v decimal(20,6)",
            ("INSERT INTO {t} VALUES (3, 1.000001)", {"id": 3, "v": Decimal("1.000001")}),
        ],
    ),
    "unsigned": (
        "CREATE TABLE {t} (id int PRIMARY KEY, v int)",
        [
            ("INSERT INTO {t} VALUES (1, 5)", {"id": 1, "v": 5}),
            "ALTER TABLE {t} MODIFY v int unsigned",
            ("INSERT INTO {t} VALUES (2, 4000000000)", {"id": 2, "v": 4000000000}),
            "ALTER TABLE {t} MODIFY v bigint",
            ("INSERT INTO {t} VALUES (3, -6)", {"id": 3, "v": -6}),
        ],
    ),
    "datetime": (
        "CREATE TABLE {t} (id int PRIMARY KEY, v datetime)",
        [
            ("INSERT INTO {t} VALUES (1, '2020-01-02 03:04:05')", {"id": 1, "v": _ms("2020-01-02 03:04:05")}),
            "ALTER TABLE {t} MODIFY v datetime(6)",
            (
                "INSERT INTO {t} VALUES (2, '2020-01-02 03:04:05.123456')",
                {"id": 2, "v": _us("2020-01-02 03:04:05.123456")},
            ),
            "ALTER TABLE {t} MODIFY v datetime",
            ("INSERT INTO {t} VALUES (3, '2021-01-02 03:04:05')", {"id": 3, "v": _ms("2021-01-02 03:04:05")}),
        ],
    ),
    "drop_readd": (
        "CREATE TABLE {t} (id int PRIMARY KEY, a int, b varchar(5))",
        [
            ("INSERT INTO {t} VALUES (1, 10, 'x')", {"id": 1, "a": 10, "b": "x"}),
            "ALTER TABLE {t} DROP COLUMN a",
            ("INSERT INTO {t} VALUES (2, 'y')", {"id": 2, "b": "y"}),
            "ALTER TABLE {t} ADD COLUMN a int FIRST",
            ("INSERT INTO {t} (id, a, b) VALUES (3, 30, 'z')", {"a": 30, "id": 3, "b": "z"}),
        ],
    ),
}


def _sql(text: str, table: str) -> str:
    return text.replace("{t}", f"`{table}`").replace("{long}", "é" * 150)


def _metadata(db, value: str) -> None:
    execute(db, f"SET GLOBAL binlog_row_metadata = '{value}'")


@pytest.fixture
def minimal(mariadb_db):
    """binlog_row_metadata=MINIMAL for the test's events (restored to the session's FULL after)."""
    _metadata(mariadb_db, "MINIMAL")
    try:
        yield mariadb_db
    finally:
        _metadata(mariadb_db, "FULL")


def _created(db, tmp_path, cases, **props):
    for case in cases:
        execute(db, _sql(CASES[case][0], case))
    config = pipeline(db, tmp_path / "st", **props)
    run_capture(config)  # empty tables: the offset starts here
    return config


def _afters(results, db, table) -> list[dict]:
    rows = []
    for result in results:
        batch = Batch(result.batch_path)
        if f"{db.name}.{table}" in batch.tables():
            rows += [r for rb in batch.iter_events(f"{db.name}.{table}") for r in rb.to_pylist()]
    assert all(r["op"] == "c" for r in rows)
    return [r["after"] for r in rows]


def _assert_exact(results, db, cases) -> None:
    for case in cases:
        expected = [step[1] for step in CASES[case][1] if isinstance(step, tuple)]
        got = _afters(results, db, case)
        assert got == expected, f"{case}: staged rows differ from the rows written"
        assert [list(g) for g in got] == [list(e) for e in expected], f"{case}: column order"


@pytest.mark.parametrize("windows", ["inside", "across"])
def test_full_metadata_rows_are_exact(mariadb_db, tmp_path, windows):
    """With FULL metadata each table map states the structure: exact inside and across windows."""
    config = _created(mariadb_db, tmp_path, CASES)
    results = []
    longest = max(len(steps) for _, steps in CASES.values())
    for i in range(longest):  # interleave the cases: DDLs of several tables inside the window
        for case, (_, steps) in CASES.items():
            if i < len(steps):
                step = steps[i]
                execute(mariadb_db, _sql(step[0] if isinstance(step, tuple) else step, case))
        if windows == "across":
            results.append(run_capture(config))
    if windows == "inside":
        results.append(run_capture(config))
    _assert_exact(results, mariadb_db, CASES)


def test_minimal_metadata_across_windows_is_exact(minimal, tmp_path):
    """Without column names, a version read before any later DDL on its table is proved exact."""
    config = _created(minimal, tmp_path, CASES)
    results = []
    for case, (_, steps) in CASES.items():
        for step in steps:
            execute(minimal, _sql(step[0] if isinstance(step, tuple) else step, case))
            results.append(run_capture(config))
    _assert_exact(results, minimal, CASES)


def test_minimal_metadata_one_ddl_per_window_is_exact(minimal, tmp_path):
    cases = ["reorder", "unsigned"]
    config = _created(minimal, tmp_path, cases)
    results = []
    for start, end in ((0, 1), (1, 3), (3, 5), (5, 7)):  # each window: one DDL per table, then a row
        for case in cases:
            for step in CASES[case][1][start:end]:
                execute(minimal, _sql(step[0] if isinstance(step, tuple) else step, case))
        results.append(run_capture(config))
    _assert_exact(results, minimal, cases)


@pytest.mark.parametrize("case", sorted(CASES))
def test_minimal_metadata_inside_one_window_stops(minimal, tmp_path, case):
    """Two DDLs with rows between them in one window: the history read after the later DDL cannot
    prove the earlier structure (a swap of same-typed columns even looks compatible): SchemaError."""
    config = _created(minimal, tmp_path, [case])
    offset = state(config).data["offset"]
    for step in CASES[case][1]:
        execute(minimal, _sql(step[0] if isinstance(step, tuple) else step, case))
    with pytest.raises(SchemaError) as err:
        run_capture(config)
    message = str(err.value)
    assert f"{minimal.name}.{case}" in message and "binlog." in message
    assert "binlog_row_metadata" in message + str(getattr(err.value, "hint", ""))
    assert state(config).data["offset"] == offset, "the offset moved"


def test_minimal_metadata_later_ddl_after_the_window_stops(minimal, tmp_path):
    """A DDL logged after a bounded window but before its history was read is found by the look-ahead."""
    config = _created(minimal, tmp_path, ["reorder"], run__max__events=1)
    for step in CASES["reorder"][1][:4]:  # row, swap, row, move
        execute(minimal, _sql(step[0] if isinstance(step, tuple) else step, "reorder"))
    first = run_capture(config)  # the first row's transaction only
    assert _afters([first], minimal, "reorder") == [{"id": 1, "a": 10, "b": 20}]
    offset = state(config).data["offset"]
    with pytest.raises(SchemaError, match=r"later DDL at binlog\.\d+:\d+"):
        run_capture(config)  # the swap and its row; the next DDL is past the window end
    assert state(config).data["offset"] == offset


def test_schema_change_events_describe_the_structure_at_their_position(mariadb_db, tmp_path):
    config = _created(mariadb_db, tmp_path, ["rename"])
    for step in CASES["rename"][1]:
        execute(mariadb_db, _sql(step[0] if isinstance(step, tuple) else step, "rename"))
    execute(mariadb_db, "ALTER TABLE `rename` ADD COLUMN z int", "ALTER TABLE `rename` DROP COLUMN z")
    result = run_capture(config)
    changes = Batch(result.batch_path).manifest["schema_changes"]
    columns = [
        [c["name"] for c in ch["tableChanges"][0]["table"]["columns"]] if ch["tableChanges"] else None
        for ch in changes
    ]
    # CHANGE and RENAME COLUMN: stated by the next row's table map; ADD z: no row before the DROP,
    # so its structure is unknown and left out rather than reported wrong; DROP z: the last read
    assert columns == [["id", "x", "b"], ["id", "x", "a"], None, ["id", "x", "a"]]
    assert [ch["ddl"].split()[3] for ch in changes] == ["CHANGE", "RENAME", "ADD", "DROP"]
