"""``skip.messages.without.change`` on PostgreSQL: with REPLICA IDENTITY FULL an update that changes
no captured column is not staged (an unchanged TOAST value counts as unchanged), on both decoders;
without FULL every update is staged (no old row to compare with), as in Debezium; a dropped update
neither drops a snapshot chunk row nor takes a transaction order; replays converge."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.sources.postgres.columnar import DECODER_ENV, native_available
from airflow_cdc.sources.postgres.source import PostgresSource
from tests.integration.postgres.support import assert_converged, pipeline, run_capture
from tests.support.pipeline import snapshot_pending

BIG = "".join(f"{i:08x}" for i in range(3000))  # 24 kB: TOASTed


def _exec(db: Any, *statements: str) -> None:
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _events(config: dict[str, Any], table: str, kind: str = "stream") -> list[dict[str, Any]]:
    out = []
    for batch in list_batches(config["staging.path"], config["name"]):
        if table in batch.tables():
            out += [e for rb in batch.iter_events(table) for e in rb.to_pylist()]
    return [e for e in out if (e["op"] == "r") == (kind == "snapshot")]


def _config(db: Any, tmp_path: Any, **props: Any) -> dict[str, Any]:
    config = pipeline(
        db,
        tmp_path / "staging",
        **{"column.exclude.list": r"public\..*\.secret", "skip.messages.without.change": "true", **props},
    )
    while snapshot_pending(config):
        run_capture(config)
    return config


@pytest.fixture(params=["native", "python"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setenv(DECODER_ENV, "python")
    elif not native_available():
        pytest.skip("the compiled pgoutput decoder is not built")
    return str(request.param)


def test_full_identity_drops_updates_of_uncaptured_columns(pg_db, tmp_path, decoder):
    ddl = "(id int PRIMARY KEY, v text, secret text, big text)"
    _exec(
        pg_db,
        f"CREATE TABLE f {ddl}",
        "ALTER TABLE f REPLICA IDENTITY FULL",
        f"CREATE TABLE d {ddl}",
        # TOAST values in rows 1 and 5 only: updates of the others go through the compiled decoder
        *(
            f"INSERT INTO {t} SELECT g, 'v' || g, 's', CASE WHEN g IN (1, 5) THEN '{BIG}' END "
            "FROM generate_series(1, 8) g"
            for t in "fd"
        ),
    )
    config = _config(pg_db, tmp_path)
    _exec(
        pg_db,
        "UPDATE f SET secret = 'x' WHERE id = 1",  # dropped: big is an unchanged TOAST value
        "UPDATE f SET v = 'V2' WHERE id = 2",
        "UPDATE f SET v = v, big = big WHERE id IN (1, 3)",  # dropped: nothing changed at all
        "UPDATE f SET secret = 'y', v = 'V4' WHERE id = 4",
        f"UPDATE f SET big = '{BIG}x' WHERE id = 5",
        "UPDATE f SET v = NULL WHERE id = 6",
        "UPDATE f SET v = NULL, secret = 'z' WHERE id = 6",  # 2nd dropped
        "UPDATE f SET secret = 'x' WHERE id > 6",  # dropped, several rows in one transaction
        "UPDATE f SET id = 16 WHERE id = 8",  # a key change is a d + c
        "UPDATE d SET secret = 'x' WHERE id = 1",  # REPLICA IDENTITY DEFAULT: no old row, emitted
        "ALTER TABLE d REPLICA IDENTITY FULL",
        "UPDATE d SET secret = 'x' WHERE id = 2",  # now dropped
        "UPDATE d SET v = 'V3' WHERE id = 3",
    )
    run_capture(config)
    f = [(e["op"], (e["after"] or e["before"])["id"]) for e in _events(config, "public.f")]
    assert f == [("u", 2), ("u", 4), ("u", 5), ("u", 6), ("d", 8), ("c", 16)]
    d = [(e["op"], e["after"]["id"]) for e in _events(config, "public.d")]
    assert d == [("u", 1), ("u", 3)]
    assert_converged(config, ["public.f", "public.d"])


def test_default_identity_emits_every_update(pg_db, tmp_path):
    _exec(
        pg_db,
        "CREATE TABLE d (id int PRIMARY KEY, v text, secret text)",
        "INSERT INTO d VALUES (1, 'a', 's')",
    )
    config = _config(pg_db, tmp_path)
    _exec(pg_db, "UPDATE d SET secret = 'x'", "UPDATE d SET v = v")
    run_capture(config)
    assert [e["op"] for e in _events(config, "public.d")] == ["u", "u"]


def test_dropped_update_keeps_the_chunk_row(pg_db, tmp_path, monkeypatch):
    """An update the window drops, committed after a chunk was read, does not drop that chunk row:
    no event carries the row otherwise, and silver would miss it."""
    _exec(
        pg_db,
        "CREATE TABLE f (id int PRIMARY KEY, v text, secret text)",
        "ALTER TABLE f REPLICA IDENTITY FULL",
        "INSERT INTO f SELECT g, 'v' || g, 's' FROM generate_series(1, 10) g",
    )
    read_chunks = PostgresSource.read_chunks

    def read_then_update(self: PostgresSource, *args: Any, **kwargs: Any) -> Any:
        chunks = read_chunks(self, *args, **kwargs)
        # after the chunk's snapshot, inside this run's window: a transaction the chunk does not reflect
        _exec(pg_db, "UPDATE f SET secret = 'x' WHERE id <= 5", "UPDATE f SET v = 'V9' WHERE id = 9")
        return chunks

    monkeypatch.setattr(PostgresSource, "read_chunks", read_then_update)
    config = pipeline(
        pg_db,
        tmp_path / "staging",
        **{"column.exclude.list": "public.f.secret", "skip.messages.without.change": "true"},
    )
    run_capture(config)
    monkeypatch.undo()
    snapshot = sorted(e["after"]["id"] for e in _events(config, "public.f", "snapshot"))
    assert snapshot == [*range(1, 9), 10]
    assert [(e["op"], e["after"]["id"]) for e in _events(config, "public.f")] == [("u", 9)]
    assert_converged(config, ["public.f"])


def test_transaction_orders_count_emitted_events_only(pg_db, tmp_path):
    _exec(
        pg_db,
        "CREATE TABLE f (id int PRIMARY KEY, v text, secret text)",
        "ALTER TABLE f REPLICA IDENTITY FULL",
        "INSERT INTO f VALUES (1, 'a', 's'), (2, 'b', 's'), (3, 'c', 's')",
    )
    config = _config(pg_db, tmp_path, **{"provide.transaction.metadata": "true"})
    _exec(
        pg_db,
        "BEGIN; UPDATE f SET secret = 'x' WHERE id = 1; UPDATE f SET v = 'B' WHERE id = 2; "
        "UPDATE f SET secret = 'x' WHERE id = 3; UPDATE f SET v = 'C' WHERE id = 3; COMMIT",
    )
    run_capture(config)
    events = _events(config, "public.f")
    assert [e["after"]["id"] for e in events] == [2, 3]
    orders = [(e["transaction"]["total_order"], e["transaction"]["data_collection_order"]) for e in events]
    assert orders == [(1, 1), (2, 2)]
    assert_converged(config, ["public.f"])
