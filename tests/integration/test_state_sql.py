"""SqlStateStore: the StateStore contract on sqlite3, the real PostgreSQL and the real MariaDB."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from airflow_cdc.core.errors import ConfigError, StateConflict
from airflow_cdc.core.state import StateStore, open_state_store
from airflow_cdc.core.state_sql import SqlStateStore, quote_identifier

BACKENDS = ["sqlite", "postgresql", "mysql"]
StoreFactory = Callable[..., SqlStateStore]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Any]:
    """(dialect, handle): a sqlite path, the ``pg_db`` or the ``mariadb_db`` fixture value."""
    if request.param == "sqlite":
        return "sqlite", tmp_path / "state.db"
    if request.param == "postgresql":
        return "postgresql", request.getfixturevalue("pg_db")
    return "mysql", request.getfixturevalue("mariadb_db")


@pytest.fixture
def make_store(backend: tuple[str, Any]) -> StoreFactory:
    """Build a store on the backend; every operation opens its own connection."""
    dialect, handle = backend

    def factory(table: str = "airflow_cdc_state", *, detect: bool = True) -> SqlStateStore:
        if dialect == "sqlite":
            def connect() -> Any:
                return sqlite3.connect(handle, timeout=30)
        elif dialect == "postgresql":
            def connect() -> Any:
                return psycopg.connect(handle.dsn)
        else:
            connect = handle.connect
        return SqlStateStore(connect, table, None if detect else dialect)

    return factory


def test_round_trip_and_versions(make_store: StoreFactory) -> None:
    store = make_store()
    assert isinstance(store, StateStore)
    assert store.load("c") is None
    state = {"offset": {"lsn": "0/16B3748"}, "tables": ["ü", "€", "😀"], "n": 2**53, "f": 1.5}
    assert store.compare_and_set("c", None, state) == 1
    loaded = make_store().load("c")  # a second store instance sees the committed state
    assert (loaded.version, loaded.data) == (1, state)
    assert loaded.updated_at.endswith("+00:00")
    assert store.compare_and_set("c", 1, {"n": 2}) == 2
    assert store.compare_and_set("c", 2, {"n": 3}) == 3
    assert store.load("c").data == {"n": 3} and store.load("c").version == 3
    store.delete("c")
    store.delete("c")
    assert store.load("c") is None
    assert store.compare_and_set("c", None, {"n": 4}) == 1


def test_conflicts(make_store: StoreFactory) -> None:
    store = make_store(detect=False)
    store.compare_and_set("c", None, {"n": 1})
    with pytest.raises(StateConflict):
        store.compare_and_set("c", None, {"n": "duplicate"})
    with pytest.raises(StateConflict):
        store.compare_and_set("c", 5, {"n": "stale"})
    with pytest.raises(StateConflict):
        store.compare_and_set("unknown", 1, {"n": "missing"})
    assert store.load("c").data == {"n": 1} and store.load("unknown") is None
    with pytest.raises(TypeError):
        store.compare_and_set("c", 1, {"n": float("inf")})
    assert store.load("c").version == 1


def test_large_state(make_store: StoreFactory) -> None:
    store = make_store()
    big = {"tables": {f"public.t{i}": {"last_key": ["x" * 50, i]} for i in range(20_000)}}  # ~1.6 MB
    store.compare_and_set("big", None, big)
    assert store.load("big").data == big


@pytest.mark.parametrize("table", ['my state', 'we"ird`na%me?', "MixedCase"])
def test_table_names_needing_quotes(make_store: StoreFactory, table: str) -> None:
    quoted, plain = make_store(table), make_store("airflow_cdc_state")
    quoted.compare_and_set("c", None, {"in": table})
    assert plain.load("c") is None
    plain.compare_and_set("c", None, {"in": "default"})
    assert make_store(table).load("c").data == {"in": table}
    assert quoted.compare_and_set("c", 1, {"in": table, "n": 2}) == 2


def test_schema_qualified_table(make_store: StoreFactory, backend: tuple[str, Any]) -> None:
    dialect, handle = backend
    schema = {"sqlite": "main", "postgresql": "meta", "mysql": getattr(handle, "name", "")}[dialect]
    store = make_store(f"{schema}.cdc_state")
    store.compare_and_set("c", None, {"s": schema})
    assert make_store(f"{schema}.cdc_state").load("c").data == {"s": schema}
    unqualified = make_store("cdc_state").load("c")  # sqlite/mysql: the default schema is that one
    assert (unqualified is None) if dialect == "postgresql" else (unqualified.data == {"s": schema})
    assert make_store("airflow_cdc_state").load("c") is None


def test_concurrent_racers_exactly_one_commit_per_round(make_store: StoreFactory) -> None:
    workers, rounds = 4, 20
    barrier = threading.Barrier(workers, timeout=60)
    wins: dict[int, list[int]] = {i: [] for i in range(workers)}
    errors: list[BaseException] = []

    def race(me: int) -> None:
        store = make_store()  # each thread its own store: the first round also races table creation
        try:
            for r in range(rounds):
                barrier.wait()
                try:
                    store.compare_and_set("race", r or None, {"round": r, "winner": me})
                    wins[me].append(r)
                except StateConflict:
                    pass
                barrier.wait()
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert [sum(r in w for w in wins.values()) for r in range(rounds)] == [1] * rounds
    final = make_store().load("race")
    assert final.version == rounds and final.data["round"] == rounds - 1
    assert rounds - 1 in wins[final.data["winner"]]


def test_open_state_store_urls(backend: tuple[str, Any]) -> None:
    dialect, handle = backend
    if dialect == "sqlite":
        url = f"sqlite://{handle}?table=url%20table"
    else:
        server = handle.server
        scheme = "postgresql" if dialect == "postgresql" else "mysql"
        auth = f"{quote(server.superuser)}:{quote(server.password, safe='')}"
        url = f"{scheme}://{auth}@{server.host}:{server.port}/{handle.name}?table=url%20table"
    store = open_state_store(url)
    assert store.compare_and_set("c", None, {"via": "url"}) == 1
    assert open_state_store(url).load("c").data == {"via": "url"}
    assert "url table" in store.describe()
    if dialect != "sqlite":
        assert handle.server.password not in store.describe()
        assert str(handle.server.port) in store.describe()


def test_wrong_password_fails(backend: tuple[str, Any]) -> None:
    dialect, handle = backend
    if dialect == "sqlite":
        pytest.skip("sqlite has no credentials")
    server = handle.server
    scheme = "postgresql" if dialect == "postgresql" else "mysql"
    store = open_state_store(f"{scheme}://{server.superuser}:wrong@{server.host}:{server.port}/{handle.name}")
    with pytest.raises(Exception, match="(?i)password|denied"):
        store.load("c")


def test_quote_identifier() -> None:
    assert quote_identifier('a"b', "postgresql") == '"a""b"'
    assert quote_identifier("a`b", "mysql") == "`a``b`"
    assert quote_identifier("a b", "sqlite") == '"a b"'
    with pytest.raises(ConfigError):
        quote_identifier("", "sqlite")
    with pytest.raises(ConfigError):
        SqlStateStore(lambda: None, dialect="oracle")


def test_lease_in_a_sibling_table(make_store: StoreFactory) -> None:
    """The connector lease lives in ``<table>_lease`` of the same database (schema-qualified too)."""
    from airflow_cdc.core.errors import LeaseHeld
    from airflow_cdc.core.lease import acquire

    store = make_store("cdc_state")
    store.compare_and_set("c", None, {"n": 1})
    lease = acquire(store, "c", "capture", 30)
    with pytest.raises(LeaseHeld, match="held by capture on host"):
        acquire(make_store("cdc_state"), "c", "apply", 30)
    lease.check()
    lease.release()
    again = acquire(store, "c", "apply", 30)
    assert again.token == 2
    again.release()
    assert store.load("c").version == 1  # taking and renewing leases never touches the state's version
    assert store.lease_store().describe().endswith("(leases)")
