"""``snapshot.select.statement.overrides``: the properties pair up, statements are checked lexically per
dialect (one SELECT; trailing ``;`` and ``ORDER BY`` dropped), result columns against the table's,
and a table's relation is built once per run."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_cdc.core import snapshot_overrides as so
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.sources.mysql.config import mysql_config
from airflow_cdc.sources.postgres.config import pg_config
from airflow_cdc.sources.sqlserver.config import sqlserver_config

BASE = {"name": "c", "staging.path": "/tmp/s"}
P = so.OVERRIDES


def _pg(**props: Any) -> Any:
    return pg_config({**BASE, **props})


def test_properties_pair_up() -> None:
    config = _pg(**{P: "s.a,s.b", f"{P}.s.a": "SELECT * FROM s.a", f"{P}.s.b": "SELECT * FROM s.b"})
    assert so.configured(config) == {
        "s.a": (f"{P}.s.a", "SELECT * FROM s.a"),
        "s.b": (f"{P}.s.b", "SELECT * FROM s.b"),
    }
    with pytest.raises(ConfigError, match=rf"'{P}' lists 's.b' but '{P}.s.b' is not set"):
        so.configured(_pg(**{P: "s.a,s.b", f"{P}.s.a": "SELECT 1"}))
    with pytest.raises(ConfigError, match=rf"'{P}.s.c' is set but '{P}' does not list 's.c'"):
        so.configured(_pg(**{P: "s.a", f"{P}.s.a": "SELECT 1", f"{P}.s.c": "SELECT 1"}))
    with pytest.raises(ConfigError, match=rf"'{P}.s.a': the statement is empty"):
        _pg(**{P: "s.a", f"{P}.s.a": "  "})
    assert so.configured(_pg()) == {}


@pytest.mark.parametrize("build", [mysql_config, sqlserver_config])
def test_every_sql_connector_declares_both(build: Any) -> None:
    raw = {
        **BASE,
        "database.names": "db",
        P: "d.t",
        f"{P}.d.t": "SELECT 1",
        "skip.messages.without.change": "on",
    }
    config = build({k: v for k, v in raw.items() if build is sqlserver_config or k != "database.names"})
    assert so.configured(config) == {"d.t": (f"{P}.d.t", "SELECT 1")}
    assert config["skip.messages.without.change"] is True
    with pytest.raises(ConfigError, match="'skip.messages.without.change': invalid value"):
        build({**BASE, "skip.messages.without.change": "sometimes"})


def test_lookup_by_any_name_and_case() -> None:
    overrides = {"dbo.Orders": ("p", "s")}
    assert so.lookup(overrides, ["db.dbo.orders", "dbo.orders"], fold_case=True) == ("p", "s")
    assert so.lookup(overrides, ["db.dbo.orders", "dbo.orders"], fold_case=False) is None


@pytest.mark.parametrize(
    "statement,dialect,wrapped",
    [
        ("SELECT * FROM t WHERE f = 0 ORDER BY id DESC", so.POSTGRES, "SELECT * FROM t WHERE f = 0"),
        ("select * from t order by id;  ", so.POSTGRES, "select * from t"),
        ("SELECT * FROM t LIMIT 5 -- first five\n", so.POSTGRES, "SELECT * FROM t LIMIT 5 -- first five"),
        ("SELECT * FROM t ORDER BY id LIMIT 5", so.POSTGRES, "SELECT * FROM t ORDER BY id LIMIT 5"),
        ("SELECT TOP 5 * FROM t ORDER BY id", so.TSQL, "SELECT TOP 5 * FROM t ORDER BY id"),
        (
            "SELECT * FROM (SELECT * FROM t ORDER BY a) x",
            so.POSTGRES,
            "SELECT * FROM (SELECT * FROM t ORDER BY a) x",
        ),
        (
            "WITH x AS (SELECT 1) SELECT * FROM x ORDER BY 1",
            so.POSTGRES,
            "WITH x AS (SELECT 1) SELECT * FROM x",
        ),
        ("SELECT ';', ')', 'ORDER BY' FROM t", so.POSTGRES, "SELECT ';', ')', 'ORDER BY' FROM t"),
        ('SELECT $q$;)$q$, "a;b" FROM t /* ; ) */', so.POSTGRES, 'SELECT $q$;)$q$, "a;b" FROM t /* ; ) */'),
        ("SELECT 'it\\'s;' FROM `t;` # ;\n ORDER BY 1", so.MYSQL, "SELECT 'it\\'s;' FROM `t;` # ;"),
        ("SELECT [a;]]] FROM [t] ORDER BY [a;]]]", so.TSQL, "SELECT [a;]]] FROM [t]"),
        ("(SELECT * FROM t)", so.POSTGRES, "(SELECT * FROM t)"),
    ],
)
def test_wrappable(statement: str, dialect: so.Dialect, wrapped: str) -> None:
    assert so.wrappable(statement, "s.t", "prop", dialect) == wrapped


@pytest.mark.parametrize(
    "statement,dialect,error",
    [
        ("DELETE FROM t", so.POSTGRES, "not a SELECT statement"),
        ("SELECT 1; DROP TABLE t", so.POSTGRES, "more than one statement"),
        ("SELECT 1) x; DROP TABLE t; SELECT (1", so.POSTGRES, "unbalanced"),
        ("SELECT (1", so.POSTGRES, "unbalanced '\\('"),
        ("SELECT 'a", so.POSTGRES, "unterminated quote"),
        ("SELECT 1 /* x", so.POSTGRES, "unterminated comment"),
        ("SELECT 'a\\' FROM t", so.MYSQL, "unterminated quote"),
        (" ; ", so.POSTGRES, "empty"),
    ],
)
def test_not_wrappable(statement: str, dialect: so.Dialect, error: str) -> None:
    with pytest.raises(ConfigError, match=rf"property 'prop' \(snapshot of s.t\): .*{error}"):
        so.wrappable(statement, "s.t", "prop", dialect)


def test_check_columns() -> None:
    cols, key = ["id", "k2", "v", "w"], ["id", "k2"]
    assert so.check_columns("t", "p", ["v", "k2", "id"], cols, key, False) == {"id", "k2", "v"}
    assert so.check_columns("t", "p", ["ID", "K2"], cols, key, True) == {"id", "k2"}
    with pytest.raises(ConfigError, match="returns column 'ID', which is not a column"):
        so.check_columns("t", "p", ["ID", "k2"], cols, key, False)
    with pytest.raises(ConfigError, match="does not return the key column.s. k2"):
        so.check_columns("t", "p", ["id", "v"], cols, key, False)
    with pytest.raises(ConfigError, match="returns column 'V' more than once"):
        so.check_columns("t", "p", ["id", "k2", "v", "V"], cols, key, True)
    assert so.check_columns("t", "p", ["id", "k2", "extra"], cols, key, True, extra_ok=True) == {"id", "k2"}


def test_relation_is_checked_once_per_run() -> None:
    overrides = so.Overrides(_pg(**{P: "s.t", f"{P}.s.t": "SELECT * FROM s.t ORDER BY id"}), so.POSTGRES)
    described: list[str] = []

    def describe(statement: str, table: str, prop: str) -> list[str]:
        described.append(statement)
        return ["id", "v"]

    args = (["id", "v", "w"], ["id"], describe, lambda text, present: (text, sorted(present)))
    assert overrides.relation("s.t", ["s.t"], *args) == ("SELECT * FROM s.t", ["id", "v"])
    assert overrides.relation("s.t", ["s.t"], *args) == ("SELECT * FROM s.t", ["id", "v"])
    assert overrides.relation("s.u", ["s.u"], *args) is None
    assert described == ["SELECT * FROM s.t"]
    overrides.clear()
    overrides.relation("s.t", ["s.t"], *args)
    assert len(described) == 2
    assert overrides.unused(["s.u"]) == ["s.t"] and overrides.unused(["s.t"]) == []
    overrides.clear()
    with pytest.raises(ConfigError, match="no key columns, so its snapshot is read whole"):
        overrides.relation("s.t", ["s.t"], ["id", "v"], [], describe, lambda text, present: text)


def test_check_all_checks_every_table_and_warns_about_listed_ones_not_captured(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Also under other names a table may be listed by (SQL Server: ``db.schema.table`` and
    ``schema.table``), the warning naming where the source captures from."""
    props = {P: "dbo.t,dbo.gone", f"{P}.dbo.t": "SELECT * FROM dbo.t", f"{P}.dbo.gone": "SELECT 1"}
    config = sqlserver_config({**BASE, "database.names": "db", **props})
    overrides = so.Overrides(config, so.TSQL, fold_case=True)
    checked: list[str] = []
    with caplog.at_level("WARNING"):
        overrides.check_all({"db.dbo.t": None}, checked.append, lambda t: (t, t.split(".", 1)[1]), "db")
    assert checked == ["db.dbo.t"]
    assert [r.getMessage() for r in caplog.records] == [f"{P}: dbo.gone not captured in db; not used"]
    caplog.clear()
    overrides.check_all(["dbo.t"], checked.append)
    assert checked == ["db.dbo.t", "dbo.t"] and "dbo.gone not captured; not used" in caplog.text
    nothing = so.Overrides(_pg(), so.POSTGRES)
    nothing.check_all(["s.t"], checked.append)
    assert checked == ["db.dbo.t", "dbo.t"]


def test_origins() -> None:
    assert so.applies("initial") and so.applies("blocking")
    assert not so.applies("adhoc") and not so.applies("verify")
