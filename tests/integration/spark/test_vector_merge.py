"""The one-scan MERGE by deletion vectors (``vectors.merge``) writes what Delta's MERGE writes,
on every column: real PostgreSQL captures of tables keyed by (date, timestamp, numeric) and by
(text, bytea, nullable uuid) through ``message.key.columns``, with random inserts,
updates, deletes, re-inserts and key changes, an update of every row (files fully superseded), a
truncate; batches applied in order, out of order, and once more after a crash between writing
the files and the commit."""

from __future__ import annotations

import datetime as dt
import random
import uuid

import psycopg
import pytest

from airflow_cdc.core.batch import list_batches
from spark_jobs.cdc_apply import vectors
from spark_jobs.cdc_apply.job import ApplySettings, apply_batch
from spark_jobs.cdc_apply.layout import table_path
from tests.integration.postgres.support import pipeline, run_capture
from tests.integration.spark.support import crash_at, every_row
from tests.integration.spark.test_apply_basic import assert_silver_matches

pytestmark = pytest.mark.spark

SETTINGS = ApplySettings(rewrite_ratio=0, deletion_vectors=True, bronze=False)
TABLES = {
    "public.k_temporal": ["d", "ts", "n"],
    "public.k_text": ["t", "b", "u"],
}
DDL = [
    "CREATE TABLE k_temporal (d date, ts timestamp(6), n numeric(12,3), v int, s text, PRIMARY KEY (d, ts, n))",
    "CREATE TABLE k_text (t text NOT NULL, b bytea NOT NULL, u uuid, v int, s text, "
    "UNIQUE NULLS NOT DISTINCT (t, b, u))",
    "ALTER TABLE k_text REPLICA IDENTITY FULL",
]
TEXTS = ["a", "A", "ä", "a ", "", "😀", "Ω-x", "z'q", 'q"z', "\\n"]


def _key(rng: random.Random, table: str) -> tuple:
    if table == "public.k_temporal":
        day = dt.date(1900, 1, 1) + dt.timedelta(days=rng.randrange(0, 200 * 365))
        stamp = dt.datetime(1960, 1, 1) + dt.timedelta(
            microseconds=rng.randrange(0, 80 * 365 * 86400 * 10**6)
        )
        return (day, stamp, rng.randrange(-(10**9), 10**9) / 1000)
    text = rng.choice(TEXTS) + rng.choice(["", str(rng.randrange(50))])
    u = None if rng.random() < 0.3 else uuid.UUID(int=rng.getrandbits(128))
    return (text, bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 4))), u)


def _where(table: str) -> str:
    return " AND ".join(f"{c} IS NOT DISTINCT FROM %s" for c in TABLES[table])


def _round(conn, rng: random.Random, live: dict[str, set], gone: dict[str, set], n: int) -> None:
    """Random inserts, updates, deletes, re-inserts and key changes in every table."""
    for table, keys in TABLES.items():
        name = table.split(".")[1]
        cols = ", ".join([*keys, "v", "s"])
        marks = ", ".join(["%s"] * (len(keys) + 2))
        for _ in range(n):
            roll = rng.random()
            value = (rng.randrange(1000), rng.choice(TEXTS) * rng.randrange(1, 4))
            if roll < 0.35 or not live[table]:
                key = (
                    rng.choice(sorted(gone[table], key=repr))
                    if gone[table] and roll < 0.1
                    else _key(rng, table)
                )
                if key in live[table]:
                    continue
                conn.execute(f"INSERT INTO {name} ({cols}) VALUES ({marks})", (*key, *value))
                live[table].add(key)
                gone[table].discard(key)
            elif roll < 0.7:
                key = rng.choice(sorted(live[table], key=repr))
                conn.execute(f"UPDATE {name} SET v = %s, s = %s WHERE {_where(table)}", (*value, *key))
            elif roll < 0.9:
                key = rng.choice(sorted(live[table], key=repr))
                conn.execute(f"DELETE FROM {name} WHERE {_where(table)}", key)
                live[table].discard(key)
                gone[table].add(key)
            else:
                key, new = rng.choice(sorted(live[table], key=repr)), _key(rng, table)
                if new in live[table]:
                    continue
                sets = ", ".join(f"{c} = %s" for c in keys)
                conn.execute(f"UPDATE {name} SET {sets} WHERE {_where(table)}", (*new, *key))
                live[table].discard(key)
                live[table].add(new)
                gone[table].add(key)


def _rows(spark, target: str, config: dict, table: str) -> list[tuple]:
    return every_row(spark, table_path(target, "silver", config["name"], table))


def _apply(spark, batch, target: str) -> dict[str, str]:
    report = apply_batch(spark, str(batch.path), target, SETTINGS)
    return {t: r.get("silver", "") for t, r in report["tables"].items()}


def test_vector_merge_writes_what_delta_merge_writes(spark, pg_db, tmp_path, monkeypatch):
    rng = random.Random(7)
    live: dict[str, set] = {t: set() for t in TABLES}
    gone: dict[str, set] = {t: set() for t in TABLES}
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        for statement in DDL:
            conn.execute(statement)
        _round(conn, rng, live, gone, 40)
    config = pipeline(
        pg_db, tmp_path / "staging", message__key__columns=r"public\.k_text:t,b,u", skipped__operations="none"
    )
    run_capture(config)  # the snapshot
    for step in range(3):
        with psycopg.connect(pg_db.dsn) as conn:  # one transaction per step
            _round(conn, rng, live, gone, 25)
            if step == 1:
                conn.execute("UPDATE k_temporal SET v = v + 1")  # every stored row superseded
                conn.execute("TRUNCATE k_text")
                live["public.k_text"].clear()
                _round(conn, rng, live, gone, 10)
        run_capture(config)
    batches = list_batches(config["staging.path"], config["name"])
    assert len(batches) == 4

    vec, ref, shuffled = (str(tmp_path / n) for n in ("vec", "ref", "shuffled"))
    ways = [_apply(spark, b, vec) for b in batches[:-1]]
    with monkeypatch.context() as patch:
        patch.setattr(vectors, "applies", lambda *a: False)
        delta_ways = [_apply(spark, b, ref) for b in batches]

    # the last batch: killed between writing its files and vectors and committing, then re-run
    with crash_at(monkeypatch, vectors, "apply_before_vector_commit"):
        _apply(spark, batches[-1], vec)
    ways.append(_apply(spark, batches[-1], vec))
    for table in TABLES:
        assert [w[table] for w in ways[1:]] == ["merged (deletion vectors)"] * 3, ways
        assert {w[table] for w in delta_ways[1:]} == {"merged"}, delta_ways
        assert _rows(spark, vec, config, table) == _rows(spark, ref, config, table), table
        assert_silver_matches(spark, config, vec, table, TABLES[table])

    # out of order (the newest first): the same rows
    for b in [batches[0], batches[3], batches[1], batches[2]]:
        _apply(spark, b, shuffled)
    for table in TABLES:
        assert _rows(spark, shuffled, config, table) == _rows(spark, ref, config, table), table

    # the history records MERGEs whose metrics count what happened (no row copied)
    path = table_path(vec, "silver", config["name"], "public.k_temporal")
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    merges = [h for h in history if h["operation"] == "MERGE"]
    assert len(merges) == 3
    metrics = [h["operationMetrics"] for h in merges]
    assert all(m["numTargetRowsCopied"] == "0" for m in metrics), metrics
    assert any(int(m["numTargetFilesRemoved"]) > 0 for m in metrics), metrics  # the update of every row
    assert any(int(m["numTargetDeletionVectorsAdded"]) > 0 for m in metrics), metrics
