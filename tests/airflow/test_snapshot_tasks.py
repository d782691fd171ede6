"""``snapshot_tasks``: a table's snapshot spread over mapped ``read_snapshot_part`` tasks in a real
``airflow dags test`` run, committed in order; the replay equals the source."""

from __future__ import annotations

import re

from tests.airflow.conftest import pg_connection_env, write_dag
from tests.airflow.support import direct_props, pipeline_props, write_pipeline
from tests.integration.postgres.support import assert_converged
from tests.support.pipeline import snapshot_pending

CONN = "cdc_pg_parts"


def test_snapshot_spread_over_three_mapped_tasks(pg_db, tmp_path, airflow_cli):
    with pg_db.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO big SELECT g, 'v' || g FROM generate_series(1, 900) g")
    staging = tmp_path / "staging"
    extra = {
        "table.include.list": "public.big",
        "snapshot.max.rows.per.run": 300,
        "incremental.snapshot.chunk.size": 40,
    }
    props = pipeline_props(pg_db, staging, **extra)
    dag_id = f"parts_{pg_db.name}"
    options = {
        "dag_id": dag_id,
        "cdc_conn_id": CONN,
        "apply": False,
        "retries": 0,
        "sense": False,
        "snapshot_tasks": 3,
    }
    dags = tmp_path / "dags"
    write_dag(dags, write_pipeline(tmp_path / "pipeline.yaml", props, options))
    env = pg_connection_env(pg_db, CONN)
    config = direct_props(pg_db, staging, **extra)
    mapped = []
    for run in range(4):
        with pg_db.connect(autocommit=True) as conn:
            conn.execute("UPDATE big SET v = 'u' || %s WHERE id %% 97 = %s", (run, run))
            conn.execute("DELETE FROM big WHERE id = %s", (run * 250 + 5,))
        out = airflow_cli.dags_test(dag_id, env=env, dags_folder=dags)
        mapped.append(sorted(set(re.findall(r"read_snapshot_part[^\n]*?map_index=(\d+)", out))))
        if run:  # the capture used the parts (a stale plan would be refused and read again)
            assert "chunk(s) of public.big loaded" in out and "stale plan" not in out, out[-4000:]
        if not snapshot_pending(config):
            break
    assert mapped[0] == [] and mapped[1] == ["0", "1", "2"], mapped
    assert not snapshot_pending(config)
    assert_converged(config, ["public.big"])
