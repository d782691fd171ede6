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
