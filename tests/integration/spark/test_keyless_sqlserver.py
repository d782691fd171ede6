"""A SQL Server table without key columns through Spark: the SIGKILL scenario of
``sqlserver/test_keyless`` (equal rows, one of them updated or deleted, deferred updates, whole
reads repeated by kills and an ad hoc snapshot) applied by Spark, every published batch in order,
orphans included.  A file of its own: a work unit of its own for the test workers
(``--dist loadfile``), beside ``test_keyless_apply.py``'s PostgreSQL and MariaDB scenarios."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_cdc.core.batch import list_batches
from spark_jobs.cdc_apply.job import ApplySettings, apply_batches
from tests.contract import harness  # noqa: F401 - loads harness_sqlserver (the two import each other)
from tests.contract.harness_sqlserver import contract_sqlserver_emulator, mssql_contract_db  # noqa: F401
from tests.integration.spark.support import (
    diff,
    normalised_list,
    normalised_rows,
    semantic_names,
    silver_multiset,
    silver_rows,
)
from tests.integration.sqlserver.test_keyless import keyless_crash_runs, source_multiset, source_rows
from tests.support.pipeline import assert_multiset_equal, replay

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_sqlserver_keyless_convergence_with_sigkills_through_spark(spark, request, tmp_path: Path) -> None:
    """Silver equals the source as a multiset (and the keyed table beside it as rows), and equals
    the reference applier's replay."""
    db = request.getfixturevalue("mssql_contract_db")
    config, runs = keyless_crash_runs(db.emulator, db.name, tmp_path, seed=11)
    assert runs.kills >= 3, f"only {runs.kills} kills happened"
    batches = list_batches(config["staging.path"], config["name"])
    target = str(tmp_path / "delta")
    apply_batches(spark, [str(b.path) for b in batches], target, ApplySettings(bronze=False))  # silver only
    ev, keyed = f"{db.name}.dbo.ev", f"{db.name}.dbo.keyed"
    names = semantic_names(config, ev)
    got = silver_multiset(spark, target, config, ev)
    source = source_multiset(config, ev)
    assert len(source) > len({repr(r) for r in source}), "the table should hold equal rows"
    assert_multiset_equal(ev, normalised_list(source, names), got)
    oracle = replay(config)
    assert oracle.keyless[ev].anomalies == 0
    assert_multiset_equal(ev, normalised_list(oracle.multiset(ev), names), got)
    names = semantic_names(config, keyed)
    got_keyed = silver_rows(spark, target, config, keyed, ["id"])
    assert not (problem := diff(normalised_rows(source_rows(config, keyed), names), got_keyed)), problem
