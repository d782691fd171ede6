"""``replica.identity.autoset.values``: the identity each captured table gets at start-up (first
matching pair), tables not captured left alone, the old images that follow, and the errors of a
bad value, a missing index and a user who does not own the table."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_cdc.core.batch import Batch
from airflow_cdc.core.errors import ConfigError, MissingPrivilege
from airflow_cdc.core.pipeline import build_config, build_store
from airflow_cdc.sources.postgres import identity
from tests.integration.postgres.support import assert_converged, execute, pipeline, run_capture

PROP = "replica.identity.autoset.values"


def _identities(dsn: str) -> dict[str, str]:
    rows = execute(
        dsn,
        "SELECT n.nspname || '.' || c.relname, c.relreplident::text || coalesce(':' || ("
        "SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "WHERE x.indrelid = c.oid AND x.indisreplident), '') FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND n.nspname IN ('public', 'other')",
    )
    return dict(rows)


@pytest.fixture
def tables(pg_db: Any) -> Any:
    execute(
        pg_db.dsn,
        "CREATE TABLE a (id int PRIMARY KEY, v text, n int)",
        "CREATE TABLE b (id int PRIMARY KEY, code text NOT NULL, v text)",
        "CREATE UNIQUE INDEX b_uk ON b (code)",
        "CREATE TABLE keep (id int PRIMARY KEY, v text)",
        "CREATE SCHEMA other",
        "CREATE TABLE other.c (id int PRIMARY KEY, v text)",
        "INSERT INTO a VALUES (1, 'x', 1), (2, 'y', 2)",
        "INSERT INTO b VALUES (1, 'one', 'x')",
    )
    return pg_db


def test_identities_set_on_captured_tables_only(tables: Any, tmp_path: Any) -> None:
    value = "public\\.a:FULL, public\\.b:INDEX b_uk, public\\.a:NOTHING, other\\..*:FULL"
    config = pipeline(tables, tmp_path / "staging", **{PROP: value, "table.include.list": "public\\..*"})
    run_capture(config)
    assert _identities(tables.dsn) == {
        "public.a": "f",
        "public.b": "i:b_uk",
        "public.keep": "d",
        "other.c": "d",  # matches, but is not captured
    }
    execute(tables.dsn, "UPDATE a SET n = 10 WHERE id = 1", "UPDATE b SET v = 'z' WHERE id = 1")
    result = run_capture(config)
    batch = Batch(result.batch_path)
    (a_update,) = [r for rb in batch.iter_events("public.a") for r in rb.to_pylist()]
    assert a_update["before"] == {"id": 1, "v": "x", "n": 1}  # FULL: the whole old row
    (b_update,) = [r for rb in batch.iter_events("public.b") for r in rb.to_pylist()]
    assert b_update["op"] == "u"
    assert_converged(config, ["public.a", "public.b"])
    run_capture(config)  # already set: nothing to change, nothing fails
    execute(tables.dsn, "ALTER TABLE a REPLICA IDENTITY DEFAULT")
    run_capture(config)  # set again at the next start
    assert _identities(tables.dsn)["public.a"] == "f"


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("public.a", "is not '<table regex>:<identity>'"),
        ("public.a:EVERYTHING", "'EVERYTHING' for 'public.a' is not one of"),
        ("public.a:INDEX", "is not one of DEFAULT, FULL, NOTHING, INDEX <index name>"),
        ("public.(:FULL", "is not a regular expression"),
    ],
)
def test_bad_values_are_config_errors(value: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        identity.parse(value)


def _nothing_stored(config: dict[str, Any]) -> bool:
    return build_store(build_config(config)).load(config["name"]) is None


def test_missing_index_and_non_owner_fail_at_start(tables: Any, tmp_path: Any) -> None:
    config = pipeline(tables, tmp_path / "staging", **{PROP: "public.b:INDEX nope"})
    with pytest.raises(ConfigError, match=r"replica.identity.autoset.values.*INDEX nope on table public.b"):
        run_capture(config)
    assert _nothing_stored(config)
    role = f"cdc_{tables.name}"
    execute(
        tables.dsn,
        f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'pw'",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}",
        f"GRANT CREATE ON DATABASE {tables.name} TO {role}",
    )
    try:
        user = dict(config, **{PROP: "public.a:FULL", "database.user": role, "database.password": "pw",
                               "table.include.list": "public\\..*"})  # fmt: skip
        with pytest.raises(MissingPrivilege, match="REPLICA IDENTITY FULL on table public.a") as err:
            run_capture(user)
        assert "as the table's owner" in (err.value.hint or "")
        assert _nothing_stored(user)
        assert _identities(tables.dsn)["public.a"] == "d"
    finally:
        execute(tables.dsn, f"DROP OWNED BY {role}", f"DROP ROLE {role}")
