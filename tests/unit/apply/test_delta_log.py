"""The pyarrow-only log replay on hand-built ``_delta_log`` folders: files, row counts, marks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_jobs.cdc_apply import delta_log


def _commit(log: Path, version: int, actions: list[dict]) -> None:
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def _add(path: str, records: int, dv: int | None = None) -> dict:
    add = {"path": path, "size": 100 * records, "stats": json.dumps({"numRecords": records})}
    if dv is not None:
        add["deletionVector"] = {"storageType": "u", "pathOrInlineDv": f"dv{dv}", "cardinality": dv}
    return {"add": add}


def _remove(path: str, dv: int | None = None) -> dict:
    remove: dict = {"path": path}
    if dv is not None:
        remove["deletionVector"] = {"storageType": "u", "pathOrInlineDv": f"dv{dv}", "cardinality": dv}
    return {"remove": remove}


@pytest.mark.parametrize("removes_first", [True, False])
def test_a_new_deletion_vector_keeps_the_file_live_with_fewer_rows(tmp_path, removes_first):
    """A MERGE with deletion vectors removes and re-adds the same path in one commit (in either
    order): the file stays live, its live rows are its records minus the vector's cardinality."""
    log = tmp_path / "t" / "_delta_log"
    _commit(log, 0, [{"metaData": {"configuration": {"delta.enableDeletionVectors": "true"}}}])
    _commit(log, 1, [_add("a.parquet", 1000), _add("b.parquet", 500)])
    swap = [_remove("a.parquet"), _add("a.parquet", 1000, dv=7)]
    _commit(log, 2, [*(swap if removes_first else swap[::-1]), _add("new.parquet", 7)])
    swap = [_remove("a.parquet", dv=7), _add("a.parquet", 1000, dv=9)]
    _commit(log, 3, [*(swap if removes_first else swap[::-1]), {"txn": {"appId": "x", "version": 1}}])
    state = delta_log.replay(str(tmp_path / "t"))
    assert state.files == {"a.parquet": 991, "b.parquet": 500, "new.parquet": 7}
    assert state.records == 1498
    assert state.has_applied("x") and not state.has_applied("y")
    _commit(log, 4, [_remove("a.parquet", dv=9), _remove("new.parquet"), _add("c.parquet", 998)])
    assert delta_log.replay(str(tmp_path / "t")).files == {"b.parquet": 500, "c.parquet": 998}


def _stats_add(path: str, records: int, nulls: dict[str, int] | None) -> dict:
    stats = {"numRecords": records, **({"nullCount": nulls} if nulls is not None else {})}
    return {"add": {"path": path, "size": 10, "stats": json.dumps(stats)}}


def test_all_null_from_file_statistics_under_column_mapping(tmp_path):
    """``__pending`` proved NULL in every row by the statistics (keyed by the column mapping's
    physical name), so the apply job skips its query; any file without that proof, or a table
    whose log says nothing, leaves the question to the query.  Partition columns and the schema
    come from the newest metaData (bronze's layout without DESCRIBE DETAIL)."""
    log = tmp_path / "t" / "_delta_log"
    fields = [
        {"name": "id", "type": "integer", "nullable": True, "metadata": {"delta.columnMapping.physicalName": "col-1"}},
        {"name": "__pending", "type": "string", "nullable": True,
         "metadata": {"delta.columnMapping.physicalName": "col-9"}},
    ]  # fmt: skip
    meta = {
        "configuration": {"delta.columnMapping.mode": "name"},
        "partitionColumns": ["__date"],
        "schemaString": json.dumps({"type": "struct", "fields": fields}),
    }
    assert delta_log.replay(str(tmp_path / "t")).all_null("__pending") is None  # no table
    _commit(log, 0, [{"metaData": meta}])
    state = delta_log.replay(str(tmp_path / "t"))
    assert state.all_null("__pending") is True and state.partition_columns == ["__date"]
    assert state.physical_name("__pending") == "col-9" and state.physical_name("gone") is None
    _commit(log, 1, [_stats_add("a", 5, {"col-1": 0, "col-9": 5}), _stats_add("b", 3, {"col-9": 3})])
    assert delta_log.replay(str(tmp_path / "t")).all_null("__pending") is True
    assert delta_log.replay(str(tmp_path / "t")).all_null("id") is False  # a holds ids
    _commit(log, 2, [_stats_add("c", 4, {"col-9": 3})])  # one row of c waits
    assert delta_log.replay(str(tmp_path / "t")).all_null("__pending") is False
    _commit(log, 3, [_remove("c"), _stats_add("d", 2, None)])  # d: no null counts
    assert delta_log.replay(str(tmp_path / "t")).all_null("__pending") is None
    _commit(log, 4, [_remove("d"), {"add": {"path": "e", "size": 1}}])  # e: no statistics
    assert delta_log.replay(str(tmp_path / "t")).all_null("__pending") is None
    _commit(log, 5, [_remove("e")])
    state = delta_log.replay(str(tmp_path / "t"))
    assert state.all_null("__pending") is True and set(state.stats) == {"a", "b"}
    plain = {
        **meta,
        "schemaString": json.dumps({"type": "struct", "fields": [{"name": "id", "type": "integer"}]}),
    }
    _commit(log, 6, [{"metaData": plain}])
    assert delta_log.replay(str(tmp_path / "t")).all_null("__pending") is True  # no such column
