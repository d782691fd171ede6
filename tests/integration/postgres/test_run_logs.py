"""What a capture run tells its log: where it starts and stops (offsets), what snapshot chunks it
reads, its rate, and whether it caught up or left work for the next run."""

from __future__ import annotations

import logging

import psycopg

from airflow_cdc.core.pipeline import build_capture
from tests.integration.postgres.support import pipeline


def test_capture_logs_offsets_progress_and_lag(pg_db, tmp_path, caplog):
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO public.t SELECT g, 'v' || g FROM generate_series(1, 30) g")
    config = pipeline(pg_db, tmp_path, **{"incremental.snapshot.chunk.size": 10, "snapshot.max.rows.per.run": 10,
                                          "run.max.events": 5})  # fmt: skip
    with caplog.at_level(logging.INFO, logger="airflow_cdc"):
        build_capture(config).run(commit=True)
    first = caplog.text
    assert "reading changes from" in first and "snapshot: 1 chunk(s) of public.t" in first
    assert "snapshot rows in" in first and "snapshots pending: public.t" in first
    with psycopg.connect(pg_db.dsn, autocommit=True) as conn:
        conn.execute("UPDATE public.t SET v = v || '+'")  # 30 events in one transaction: > 5
        conn.execute("INSERT INTO public.t VALUES (100, 'x')")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="airflow_cdc"):
        build_capture(config).run(commit=True)
    assert "bounded by run.max.events: the source holds more" in caplog.text
    for _ in range(5):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="airflow_cdc"):
            build_capture(config).run(commit=True)
        if "caught up with the source's position" in caplog.text and "snapshots pending" not in caplog.text:
            break
    else:
        raise AssertionError("never caught up:\n" + caplog.text[-3000:])
    assert pg_db.server.password not in caplog.text
