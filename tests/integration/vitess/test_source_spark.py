"""The two-shard SIGKILL convergence scenario, with the keyspace resharded (2 shards -> 1) in the
middle of a capture run while the copy phase is unfinished, replayed through the Spark apply job:
silver equals the union of the shards and the reference applier (every published batch, committed
or not, applied in order, as a crash after apply and before commit leaves them)."""

from __future__ import annotations

import pytest

from airflow_cdc.core.batch import list_batches
from tests.integration.spark.support import apply_backlog, diff, normalised_rows, semantic_names, silver_rows
from tests.integration.vitess.capture_support import shard_rows
from tests.integration.vitess.test_source_convergence import sigkill_scenario
from tests.support.pipeline import replay

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_sigkill_scenario_through_spark(spark, vtgate, shard_servers, keyspace, tmp_path):
    props = sigkill_scenario(vtgate, shard_servers, keyspace, tmp_path, reshard_at=3)
    target = str(tmp_path / "delta")
    batches = list_batches(props["staging.path"], props["name"])
    apply_backlog(spark, batches, target)
    table = f"{keyspace}.orders"
    names = semantic_names(props, table)
    got = silver_rows(spark, target, props, table, ["id"])
    expected = normalised_rows(shard_rows(vtgate, keyspace), names)
    assert len(expected) > 150
    assert not (problem := diff(expected, got)), f"silver vs shards: {problem}"
    oracle = normalised_rows(replay(props).rows(table), names)
    assert not (problem := diff(oracle, got)), f"silver vs reference applier: {problem}"
