"""A partitioned connector (SQL Server ``database.names`` with two databases) applied through
Spark: each partition's batches land in the connector's tables side by side, commit checks the
right Delta tables, and ``verify`` walks every partition's tables."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_cdc.apply.applied import ensure_applied
from airflow_cdc.apply.verify import verify
from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.pipeline import build_captures, build_config
from airflow_cdc.testing.sqlserver_emulator import SqlServerCdcEmulator
from spark_jobs.cdc_apply.job import apply_batch
from tests.contract.harness import HARNESSES  # noqa: F401 (loads the harnesses in their order)
from tests.contract.harness_sqlserver import contract_sqlserver_emulator  # noqa: F401
from tests.integration.sqlserver.test_source_databases import properties, two_dbs  # noqa: F401

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def sqlserver_emulator(contract_sqlserver_emulator: SqlServerCdcEmulator) -> Iterator[SqlServerCdcEmulator]:  # noqa: F811
    yield contract_sqlserver_emulator


def test_partitions_apply_side_by_side_and_verify(
    spark, sqlserver_emulator: SqlServerCdcEmulator, two_dbs: list[str], tmp_path: Path  # noqa: F811
) -> None:
    emu = sqlserver_emulator
    target = str(tmp_path / "delta")
    props = properties(emu, two_dbs, tmp_path / "staging", **{"delta.root": target})
    captures = build_captures(props)
    for _ in range(4):  # snapshots in chunks of 12 rows; a change to one database in between
        with emu.pg_connect(two_dbs[1]) as pg:
            pg.execute("UPDATE dbo.orders SET item = 'changed' WHERE id = 3")
        emu.run_capture_job(two_dbs[1])
        for capture in captures:
            result = capture.run()
            batch = list_batches(capture.config["staging.path"], capture.name)[-1]
            assert batch.batch_id == result.batch_id and batch.manifest["connector"] == "multi"
            apply_batch(spark, str(batch.path), target)
            ensure_applied(batch, capture.config)  # the connector's tables, not the partition's name
            capture.commit(batch)
    report = verify(build_config(props), target, spark=spark)
    assert report.ok, report.to_json()
    assert sorted(t.table for t in report.tables) == sorted(f"{db}.dbo.orders" for db in two_dbs)
    assert [t.source_rows for t in report.tables] == [25, 35]
    assert (Path(target) / "silver" / "multi").is_dir() and not list(Path(target, "silver").glob("multi.*"))
