"""``snapshot.select.statement.overrides``, PostgreSQL's own cases (the contract suite has the common
ones): the statement is described in a read-only transaction, key columns keep their type (a domain
is its base type), the lexer keeps dollar quotes and comments whole, and side-by-side snapshot readers
(``snapshot.max.threads``) read the override too."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.snapshot_overrides import OVERRIDES
from tests.integration.postgres.support import pipeline, run_capture
from tests.support.pipeline import replay, snapshot_pending


def _exec(db: Any, *statements: str) -> Any:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        out = None
        for s in statements:
            out = conn.execute(s).fetchall() if s.lstrip().upper().startswith("SELECT") else conn.execute(s)
        return out


def _config(db: Any, tmp_path: Any, statement: str, **props: Any) -> dict[str, Any]:
    return pipeline(
        db,
        tmp_path / "staging",
        **{
            "table.include.list": "public.t",
            OVERRIDES: "public.t",
            f"{OVERRIDES}.public.t": statement,
            **props,
        },
    )


@pytest.fixture
def table(pg_db: Any) -> Any:
    _exec(
        pg_db,
        "CREATE DOMAIN posint AS int CHECK (VALUE > 0)",
        "CREATE TABLE t (id posint PRIMARY KEY, delete_flag int, v text)",
        "INSERT INTO t SELECT g, (g % 3 = 0)::int, 'v' || g FROM generate_series(1, 3000) g",
    )
    return pg_db


def _silver(config: dict[str, Any]) -> set[int]:
    return {k[0] for k in replay(config).rows("public.t")}


@pytest.mark.parametrize(
    "statement,error",
    [
        ("SELECT id::text AS id, v FROM public.t", "key column 'id' with another type"),
        ("WITH d AS (DELETE FROM public.t RETURNING *) SELECT * FROM d", "data-modifying statement"),
    ],
    ids=["key-retyped", "data-modifying"],
)
def test_statement_refused_at_start(table: Any, tmp_path: Any, statement: str, error: str) -> None:
    config = _config(table, tmp_path, statement)
    with pytest.raises(ConfigError, match=error):
        run_capture(config)
    assert _exec(table, "SELECT count(*) FROM t")[0][0] == 3000


def test_domain_key_dollar_quotes_and_comments(table: Any, tmp_path: Any) -> None:
    statement = (
        "/* soft deletes */ SELECT * FROM public.t WHERE delete_flag = 0 AND v <> $x$v;1$x$ "
        "-- the rest\nORDER BY id DESC; -- trailing"
    )
    config = _config(table, tmp_path, statement, **{"snapshot.max.rows.per.run": 100_000})
    while snapshot_pending(config):
        run_capture(config)
    assert _silver(config) == {i for i in range(1, 3001) if i % 3}


def test_side_by_side_readers_read_the_override(table: Any, tmp_path: Any) -> None:
    config = _config(
        table,
        tmp_path,
        "SELECT * FROM public.t WHERE delete_flag = 0",
        **{
            "snapshot.max.threads": 2,
            "incremental.snapshot.chunk.size": 300,
            "snapshot.max.rows.per.run": 1200,
        },
    )
    runs = 0
    while snapshot_pending(config):
        run_capture(config)
        runs += 1
        assert runs < 10
    assert runs >= 2 and _silver(config) == {i for i in range(1, 3001) if i % 3}
