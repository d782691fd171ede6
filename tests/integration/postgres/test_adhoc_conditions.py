"""Ad hoc snapshot conditions on PostgreSQL: the safe language snapshots exactly the matching rows,
raw SQL is refused (nothing stored) unless the pipeline opts in."""

from __future__ import annotations

import psycopg
import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.conditions import RAW_SQL_PROPERTY
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import build_config, build_store
from tests.integration.postgres.support import pipeline, run_capture
from tests.support.conditions import (
    ODD,
    ROWS,
    check_conditions_snapshot_matching_rows,
    check_raw_sql_refused_unless_opted_in,
)


@pytest.fixture
def table(pg_db):
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE t (id int PRIMARY KEY, status text, amount numeric(10, 2), "{ODD}" int)')
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s)", ROWS)
    return pg_db


def test_conditions_snapshot_exactly_the_matching_rows(table, tmp_path):
    config = pipeline(table, tmp_path / "staging", **{"snapshot.mode": "no_data",
                                                       "incremental.snapshot.chunk.size": 3,
                                                       "snapshot.max.rows.per.run": 7})
    assert run_capture(config).snapshot_rows == 0
    check_conditions_snapshot_matching_rows(config, "public.t")


def test_raw_sql_is_refused_unless_opted_in(table, tmp_path):
    config = pipeline(table, tmp_path / "staging", **{"snapshot.mode": "no_data"})
    sig = {"execute-snapshot": {"data-collections": ["public.t"],
                                "additional-conditions": [{"data-collection": "public.t", "filter": "1=1) OR (1=1"}]}}
    with pytest.raises(ConfigError, match="expected a column name"):
        run_capture(config, signals=[sig])  # the first run: refused before its start is stored
    assert build_store(build_config(config)).load(config["name"]) is None  # no start, no state
    assert list_batches(config["staging.path"], config["name"]) == []
    run_capture(config)
    check_raw_sql_refused_unless_opted_in(config, {**config, RAW_SQL_PROPERTY: True}, "public.t", "id % 10 = 0")
