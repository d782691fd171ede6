"""Commit refuses a batch that has not reached Delta (read from hand-built ``_delta_log`` folders)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_cdc.apply.applied import delta_target, ensure_applied, missing_tables
from airflow_cdc.core.batch import Batch, BatchWriter
from airflow_cdc.core.errors import BatchNotApplied, ConfigError
from airflow_cdc.core.pipeline import build_config
from spark_jobs.cdc_apply import delta_log
from spark_jobs.cdc_apply.layout import app_id, table_path
from tests.unit.core.test_batch import _write


def _config(tmp_path: Path, **props):
    return build_config(
        {"name": "conn", "connector": "postgresql", "staging.path": str(tmp_path / "staging"), **props}
    )


def _mark(
    target: Path, layer: str, table: str, batch_id: str, *, fence: int | None = None, version=0
) -> None:
    """Write one Delta commit the way the apply job's marked write leaves it."""
    log = Path(table_path(str(target), layer, "conn", table)) / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    meta = {"airflow_cdc": {"batch_id": batch_id, **({"fence": fence} if fence is not None else {})}}
    actions = [
        {"commitInfo": {"operation": "WRITE", "userMetadata": json.dumps(meta)}},
        {"txn": {"appId": app_id("conn", batch_id), "version": 1}},
    ]
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def _batch(tmp_path: Path, snapshot_only: bool = False) -> Batch:
    writer = _write(tmp_path / "staging")
    if snapshot_only:  # a table with no change events, only snapshot rows (op r), is a table too
        writer.close_table("public.t")
        writer._tables["public.s"] = {**writer._tables["public.t"], "table": "s"}
        writer._parts["public.s"] = list(writer._parts["public.t"])
    return Batch(writer.finish({"state_after": {}, "state_version": None, "to_offset": {"lsn": "0/1"}}))


def test_unapplied_batch_refused_then_accepted_once_marked(tmp_path):
    batch, target = _batch(tmp_path, snapshot_only=True), tmp_path / "delta"
    config = _config(tmp_path, **{"delta.root": str(target)})
    with pytest.raises(BatchNotApplied) as err:
        ensure_applied(batch, config)
    assert "bronze:public.s" in str(err.value) and "silver:public.t" in str(err.value)
    assert f"run apply for batch {batch.batch_id}" in str(err.value)
    for table in ("public.s", "public.t"):
        _mark(target, "silver", table, batch.batch_id)
    # bronze is still missing: a half-applied batch (crash between layers) is not applied
    assert missing_tables(batch, str(target), bronze=True) == ["bronze:public.s", "bronze:public.t"]
    for table in ("public.s", "public.t"):
        _mark(target, "bronze", table, batch.batch_id)
    ensure_applied(batch, config)


def test_another_batchs_mark_does_not_count(tmp_path):
    batch, target = _batch(tmp_path), tmp_path / "delta"
    _mark(target, "silver", "public.t", "20000101T000000000000Z-abcdef")
    _mark(target, "bronze", "public.t", "20000101T000000000000Z-abcdef")
    with pytest.raises(BatchNotApplied):
        ensure_applied(batch, _config(tmp_path, **{"delta.root": str(target)}))


def test_bronze_disabled_checks_silver_only(tmp_path):
    batch, target = _batch(tmp_path), tmp_path / "delta"
    config = _config(tmp_path, **{"delta.root": str(target), "delta.bronze.enabled": False})
    with pytest.raises(BatchNotApplied, match="silver:public.t"):
        ensure_applied(batch, config)
    _mark(target, "silver", "public.t", batch.batch_id)
    ensure_applied(batch, config)


def test_empty_batch_commits(tmp_path):
    batch = Batch(BatchWriter(tmp_path / "staging", "conn").finish({}))
    assert batch.tables() == []
    ensure_applied(
        batch,
        _config(tmp_path, **{"delta.root": str(tmp_path / "nowhere"), "commit.require.applied": "true"}),
    )


def test_policy(tmp_path, caplog):
    batch = _batch(tmp_path)
    # capture-only, said explicitly: no check even with a Delta root around
    capture_only = _config(tmp_path, **{"delta.root": str(tmp_path / "d"), "commit.require.applied": "false"})
    assert delta_target(capture_only) is None
    ensure_applied(batch, capture_only)
    # auto without any Delta root: nothing to check, but say so
    with caplog.at_level("WARNING"):
        ensure_applied(batch, _config(tmp_path))
    assert "commit.require.applied=false" in caplog.text
    # auto with a target handed over by the caller (the DAG's apply target, `commit --target`)
    with pytest.raises(BatchNotApplied):
        ensure_applied(batch, _config(tmp_path), str(tmp_path / "d"))
    with pytest.raises(ConfigError, match="no Delta root"):
        ensure_applied(batch, _config(tmp_path, **{"commit.require.applied": "true"}))


def test_check_fence_reads_the_newest_airflow_cdc_commit(tmp_path):
    path = table_path(str(tmp_path), "silver", "conn", "public.t")
    delta_log.check_fence(path, 1)  # no table yet
    _mark(tmp_path, "silver", "public.t", "b1", fence=7)
    log = Path(path) / "_delta_log"
    (log / f"{1:020d}.json").write_text(json.dumps({"commitInfo": {"operation": "OPTIMIZE"}}) + "\n")
    assert delta_log.newest_fence(path) == 7
    delta_log.check_fence(path, 7)
    delta_log.check_fence(path, None)
    with pytest.raises(delta_log.StaleFence, match="token 7, newer than this run's 6"):
        delta_log.check_fence(path, 6)


def test_fences_compare_only_within_one_partition(tmp_path):
    """Partitions of one connector (Vitess tasks) write the same tables under leases of their own:
    a partition's newer token must not fence another partition out, only its own older runs."""
    path = table_path(str(tmp_path), "silver", "conn", "public.t")
    log = Path(path) / "_delta_log"
    log.mkdir(parents=True)
    for version, (partition, fence) in enumerate([("task0_2_1", 3), ("task1_2_1", 9), (None, 5)]):
        meta = {"airflow_cdc": {"batch_id": f"b{version}", "fence": fence, "partition": partition}}
        if partition is None:
            del meta["airflow_cdc"]["partition"]
        commit = {"commitInfo": {"operation": "MERGE", "userMetadata": json.dumps(meta)}}
        (log / f"{version:020d}.json").write_text(json.dumps(commit) + "\n")
    assert delta_log.newest_fence(path, "task0_2_1") == 3
    assert delta_log.newest_fence(path, "task1_2_1") == 9
    assert delta_log.newest_fence(path) == 5
    assert delta_log.newest_fence(path, "task2_3_2") is None
    delta_log.check_fence(path, 4, "task0_2_1")  # task1's token 9 does not fence task0 out
    with pytest.raises(delta_log.StaleFence, match="token 3, newer than this run's 2"):
        delta_log.check_fence(path, 2, "task0_2_1")


def test_history_tables_need_their_marks_too(tmp_path):
    """A table with SCD type 2 history is applied only once its history log and history carry
    the batch's mark as well; other tables need none."""
    batch, target = _batch(tmp_path), tmp_path / "delta"
    assert batch.table_info("public.t").get("key_columns")
    config = _config(
        tmp_path,
        **{"delta.root": str(target), "delta.bronze.enabled": False, "delta.history.enabled": "true"},
    )
    _mark(target, "silver", "public.t", batch.batch_id)
    with pytest.raises(BatchNotApplied, match="history_log:public.t, history:public.t"):
        ensure_applied(batch, config)
    assert missing_tables(batch, str(target), False, (r"public\.other",)) == []
    assert missing_tables(batch, str(target), False, (r"PUBLIC\.T",)) == [
        "history_log:public.t",
        "history:public.t",
    ]
    _mark(target, "history_log", "public.t", batch.batch_id)
    _mark(target, "history", "public.t", batch.batch_id)
    ensure_applied(batch, config)


@pytest.mark.parametrize(
    ("enabled", "tables"),
    [("true", (".*",)), ("false", ()), ("", ()), (r"public\.a, public\.b.*", (r"public\.a", r"public\.b.*"))],
)
def test_history_options(tmp_path, enabled, tables):
    from airflow_cdc.apply.submit import ApplyOptions

    options = ApplyOptions.from_config(
        _config(
            tmp_path, **{"delta.history.enabled": enabled, "delta.history.except.columns": r"public\.a\.x"}
        )
    )
    assert options.history_tables() == tables
    args = options.args()
    assert [args[i + 1] for i, a in enumerate(args) if a == "--history"] == list(tables)
    assert args[args.index("--history-except") + 1] == r"public\.a\.x"


def test_history_option_that_is_not_a_regex_is_refused(tmp_path):
    from airflow_cdc.apply.submit import ApplyOptions

    with pytest.raises(ConfigError, match=r"'delta.history.except.columns'.*\(x' is not a regular expression"):
        ApplyOptions.from_config(_config(tmp_path, **{"delta.history.except.columns": r"public\.a\.(x"}))


@pytest.mark.parametrize(
    ("props", "flag"),
    [({}, "--deletion-vectors"), ({"delta.deletion.vectors.enabled": "false"}, "--no-deletion-vectors")],
    ids=["default", "opt-out"],
)
def test_deletion_vectors_are_on_unless_turned_off(tmp_path, props, flag):
    from airflow_cdc.apply.submit import ApplyOptions

    options = ApplyOptions.from_config(_config(tmp_path, **props))
    assert options.deletion_vectors is (flag == "--deletion-vectors")
    args = options.args()
    assert flag in args and {"--deletion-vectors", "--no-deletion-vectors"} & set(args) == {flag}
