"""One ad hoc snapshot scenario for every SQL source: conditions in the safe language snapshot
exactly the matching rows (row by row against the source), and raw SQL is refused unless the
pipeline opts in -- refused before anything is stored."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.conditions import RAW_SQL_PROPERTY
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_capture, build_config, build_store
from tests.support.pipeline import assert_rows_equal, run_capture

STATUSES = ["open", "it's", "closed", "é😀 ünï", None]
ODD = "Odd Col"  # a column name that needs quoting in every dialect


def row_values(i: int) -> tuple[int, str | None, Decimal | None, int]:
    """Row ``i`` of the scenario table: (id, status, amount, "Odd Col")."""
    amount = None if i % 7 == 0 else Decimal(i * 3) / 2
    return i, STATUSES[i % len(STATUSES)], amount, i % 5


ROWS = [row_values(i) for i in range(1, 41)]

#: condition in the safe language -> the rows it selects (SQL's three-valued logic by hand)
CONDITIONS: list[tuple[str, Callable[[int, str | None, Decimal | None, int], bool]]] = [
    (
        "status = 'it''s' AND id BETWEEN 10 AND 20 OR amount IS NULL",
        lambda i, s, a, o: (s == "it's" and 10 <= i <= 20) or a is None,
    ),
    (
        f'NOT ("{ODD}" IN (1, 2) OR status IS NULL) AND amount >= 12.5 AND status <> \'é😀 ünï\'',
        lambda i, s, a, o: o not in (1, 2) and s is not None and a is not None and a >= 12.5 and s != "é😀 ünï",
    ),
    (
        "STATUS = 'é😀 ünï' or id not between 3 and 38 and not amount is null",
        lambda i, s, a, o: s == "é😀 ünï" or (not 3 <= i <= 38 and a is not None),
    ),
]


def _state_version(config: Any) -> int | None:
    stored = build_store(build_config(config) if isinstance(config, dict) else config).load(_name(config))
    return None if stored is None else stored.version


def _name(config: Any) -> str:
    cfg = build_config(config) if isinstance(config, dict) else config
    return cfg.state_name


def _signal(table: str, condition: str) -> dict[str, Any]:
    return {
        "type": "execute-snapshot",
        "data": {
            "data-collections": [table],
            "type": "incremental",
            "additional-conditions": [{"data-collection": table, "filter": condition}],
        },
    }


def _batches(config: Any) -> list[Any]:
    cfg = build_config(config) if isinstance(config, dict) else config
    return list_batches(cfg["staging.path"], cfg.state_name)


def snapshot_rows(config: Any, table: str, signal: dict[str, Any], max_runs: int = 12) -> dict[tuple, Any]:
    """Run captures from ``signal`` until no snapshot is pending; the ``op = r`` rows by id."""
    seen = {b.path for b in _batches(config)}
    run_capture(config, signals=[signal])
    for _ in range(max_runs):
        stored = build_store(build_config(config) if isinstance(config, dict) else config).load(_name(config))
        if not stored.data["snapshot"]["pending"]:
            break
        run_capture(config)
    else:
        pytest.fail(f"the snapshot of {table} did not finish in {max_runs} runs")
    rows: dict[tuple, Any] = {}
    for batch in _batches(config):
        if batch.path in seen or table not in batch.tables():
            continue
        for rb in batch.iter_events(table):
            for event in rb.to_pylist():
                if event["op"] == "r":
                    assert (event["after"]["id"],) not in rows, f"row {event['after']['id']} snapshotted twice"
                    rows[(event["after"]["id"],)] = event["after"]
    return rows


def encoded_source_rows(config: Any, table: str) -> dict[tuple, Any]:
    """The live table, encoded like captured rows (the source's ``verify`` reader), by id."""
    source = build_capture(config).source
    source.open()
    try:
        return {(row["id"],): row for chunk in source.encoded_chunks(table, 10_000) for row in chunk.to_pylist()}
    finally:
        source.close()


def check_conditions_snapshot_matching_rows(config: Any, table: str) -> None:
    """Each of :data:`CONDITIONS` snapshots exactly its rows, equal to the source's."""
    live = encoded_source_rows(config, table)
    assert sorted(live) == [(r[0],) for r in ROWS]
    for condition, predicate in CONDITIONS:
        wanted = {(r[0],) for r in ROWS if predicate(*r)}
        assert wanted and len(wanted) < len(ROWS), condition  # the case selects something, not all
        got = snapshot_rows(config, table, _signal(table, condition))
        assert_rows_equal(f"{table} where {condition}", {k: live[k] for k in wanted}, got)


def check_raw_sql_refused_unless_opted_in(config: Any, opted: Any, table: str, raw: str) -> None:
    """A raw-SQL condition (and an unknown column) fail with nothing stored; with the pipeline
    ``opted`` (``config`` plus ``snapshot.additional.conditions.raw.sql=true``) the raw one works."""
    before, batches = _state_version(config), len(_batches(config))
    assert before is not None and batches  # a committed state and batches that must not change
    for condition, message in [
        (raw, f"not allowed.*{RAW_SQL_PROPERTY}=true"),
        ("no_such_col = 1", f"additional-conditions of {table}: table {table} has no column 'no_such_col'"),
    ]:
        with pytest.raises(ConfigError, match=message):
            run_capture(config, signals=[_signal(table, condition)])
        assert _state_version(config) == before and len(_batches(config)) == batches  # nothing stored
    got = snapshot_rows(opted, table, _signal(table, raw))
    assert sorted(got) == [(i,) for i in range(10, 41, 10)]  # the raw condition selects id % 10 = 0
