"""Delta commits written by this process (``log_commit``): put-if-absent versions, marks, the
tables it refuses and the versions it leaves to Spark.  Logs are made by hand here; Spark reading
and writing such tables is ``tests/integration/spark/test_log_commit_spark.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from spark_jobs.cdc_apply import delta_log, log_commit

SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "a", "type": "long", "nullable": True, "metadata": {}},
        {"name": "__date", "type": "date", "nullable": True, "metadata": {}},
    ],
}
PROTOCOL = {
    "minReaderVersion": 3,
    "minWriterVersion": 7,
    "readerFeatures": ["typeWidening"],
    "writerFeatures": ["typeWidening", "invariants", "appendOnly"],
}


def _table(path: Path, protocol: dict[str, Any] | None = None, **config: str) -> str:
    """A table's version 0 as Spark writes it for a new table (protocol, metaData, commitInfo)."""
    meta = {
        "id": "t",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(SCHEMA),
        "partitionColumns": ["__date"],
        "configuration": {"delta.enableTypeWidening": "true", **config},
    }
    _version(path, 0, [{"protocol": protocol or PROTOCOL}, {"metaData": meta}, {"commitInfo": {}}])
    return str(path)


def _version(path: Path, version: int, actions: list[dict[str, Any]]) -> None:
    log = path / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def _add(name: str, rows: int = 3) -> dict[str, Any]:
    return {
        "add": {
            "path": f"__date=2026-12-04/{name}",
            "partitionValues": {"__date": "2026-12-04"},
            "size": 10,
            "modificationTime": 1,
            "dataChange": True,
            "stats": json.dumps({"numRecords": rows}),
        }
    }


def _lines(path: Path, version: int) -> list[dict[str, Any]]:
    text = (path / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_commit_adds_files_and_marks_once(tmp_path: Path) -> None:
    table = _table(tmp_path / "t")
    assert (
        log_commit.commit(table, [_add("p0"), _add("p1", 4)], [("app:b1", 1), ("app:b2", 1)], "meta") is True
    )
    state = delta_log.replay(table)
    assert state.version == 1 and state.has_applied("app:b1") and state.has_applied("app:b2")
    assert state.records == 7
    lines = _lines(tmp_path / "t", 1)
    info = lines[0]["commitInfo"]
    assert info["userMetadata"] == "meta" and info["readVersion"] == 0 and info["isBlindAppend"]
    assert info["operationMetrics"] == {"numFiles": "2", "numOutputRows": "7"}
    assert [next(iter(a)) for a in lines] == ["commitInfo", "txn", "txn", "add", "add"]
    # a re-run: every mark is there, nothing is written
    assert log_commit.commit(table, [_add("p0")], [("app:b1", 1)], "meta") is False
    assert delta_log.replay(table).version == 1
    # only the missing mark is added
    assert log_commit.commit(table, [], [("app:b1", 1), ("app:b3", 1)], "m") is True
    assert [a["txn"]["appId"] for a in _lines(tmp_path / "t", 2) if "txn" in a] == ["app:b3"]
    assert not [n for n in os.listdir(tmp_path / "t" / "_delta_log") if n.startswith(".")]


def test_a_version_taken_by_another_writer_is_read_again(tmp_path: Path) -> None:
    table = _table(tmp_path / "t")
    stale = delta_log.replay(table)
    _version(tmp_path / "t", 1, [{"commitInfo": {}}, _add("other")])  # another writer won version 1
    assert log_commit.commit(table, [_add("mine")], [("app:b1", 1)], "m", state=stale) is True
    assert delta_log.replay(table).version == 2
    assert _lines(tmp_path / "t", 1)[1]["add"]["path"].endswith("other")  # not overwritten
    # the winner carried the mark itself: nothing more is written
    stale = delta_log.replay(table)
    _version(tmp_path / "t", 3, [{"commitInfo": {}}, {"txn": {"appId": "app:b4", "version": 1}}])
    assert log_commit.commit(table, [_add("x")], [("app:b4", 1)], "m", state=stale) is False
    assert delta_log.replay(table).version == 3


def test_the_checkpoint_versions_are_left_to_spark(tmp_path: Path) -> None:
    table = _table(tmp_path / "t", **{"delta.checkpointInterval": "3"})
    assert log_commit.commit(table, [_add("a")], [("app:1", 1)], "m") is True  # version 1
    assert log_commit.commit(table, [_add("b")], [("app:2", 1)], "m") is True  # version 2
    assert log_commit.checkpoint_due(delta_log.replay(table)) is True
    assert log_commit.commit(table, [_add("c")], [("app:3", 1)], "m") is None  # 3 is Spark's
    assert delta_log.replay(table).version == 2
    _version(tmp_path / "t", 3, [{"commitInfo": {}}])  # Spark's version 3 (and its checkpoint)
    assert log_commit.commit(table, [_add("c")], [("app:3", 1)], "m") is True
    assert delta_log.replay(table).version == 4
    default = _table(tmp_path / "d")
    for version in range(1, 9):
        _version(tmp_path / "d", version, [{"commitInfo": {}}])
    assert log_commit.checkpoint_due(delta_log.replay(default)) is False  # next is 9
    _version(tmp_path / "d", 9, [{"commitInfo": {}}])
    assert log_commit.checkpoint_due(delta_log.replay(default)) is True  # next is 10


@pytest.mark.parametrize(
    ("protocol", "config", "column_meta", "reason"),
    [
        (
            {**PROTOCOL, "writerFeatures": ["appendOnly", "rowTracking", "domainMetadata"]},
            {},
            {},
            "rowTracking",
        ),
        ({**PROTOCOL, "writerFeatures": ["clustering", "domainMetadata"]}, {}, {}, "clustering"),
        ({"minReaderVersion": 1, "minWriterVersion": 6}, {}, {}, "writer version 6"),
        (PROTOCOL, {"delta.columnMapping.mode": "name"}, {}, "column mapping"),
        (PROTOCOL, {"delta.constraints.positive": "a > 0"}, {}, "CHECK constraints"),
        (PROTOCOL, {"delta.enableInCommitTimestamps": "true"}, {}, "InCommitTimestamps"),
        (PROTOCOL, {}, {"delta.generationExpression": "a + 1"}, "generated"),
        (PROTOCOL, {}, {"delta.invariants": '{"expression": {"expression": "a > 0"}}'}, "invariant"),
    ],
)
def test_tables_that_ask_more_of_a_writer_are_refused(
    tmp_path: Path, protocol: dict[str, Any], config: dict[str, str], column_meta: dict[str, str], reason: str
) -> None:
    if column_meta:
        SCHEMA_NESTED = json.loads(json.dumps(SCHEMA))
        SCHEMA_NESTED["fields"][0] = {
            "name": "s",
            "type": {
                "type": "struct",
                "fields": [{"name": "x", "type": "long", "nullable": True, "metadata": column_meta}],
            },
            "nullable": True,
            "metadata": {},
        }
        table = _table(tmp_path / "t", protocol, **config)
        lines = _lines(tmp_path / "t", 0)
        lines[1]["metaData"]["schemaString"] = json.dumps(SCHEMA_NESTED)
        _version(tmp_path / "t", 0, lines)
    else:
        table = _table(tmp_path / "t", protocol, **config)
    state = delta_log.replay(table)
    assert reason in (log_commit.refusal(state) or "")
    assert log_commit.commit(table, [_add("a")], [("app:1", 1)], "m") is None
    assert delta_log.replay(table).version == 0  # nothing written
    marks_only = log_commit.refusal(state, adding=False)
    if reason in ("column mapping", "CHECK constraints", "generated", "invariant"):
        assert marks_only is None  # a commit without files owes the columns nothing
        assert log_commit.commit(table, [], [("app:1", 1)], "m") is True
    else:
        assert marks_only is not None


def test_no_table_is_refused(tmp_path: Path) -> None:
    assert log_commit.refusal(delta_log.replay(str(tmp_path / "none"))) == "no table yet"
    assert log_commit.commit(str(tmp_path / "none"), [], [("app:1", 1)], "m") is None


def test_a_filesystem_without_hard_links_leaves_the_commit_to_spark(tmp_path: Path, monkeypatch) -> None:
    table = _table(tmp_path / "t")

    def no_links(src: str, dst: str) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(log_commit.os, "link", no_links)
    assert log_commit.commit(table, [_add("a")], [("app:1", 1)], "m") is None
    assert delta_log.replay(table).version == 0
    assert sorted(os.listdir(tmp_path / "t" / "_delta_log")) == ["00000000000000000000.json"]
