"""Issue 38: metric names and tags, the recorder, the metrics file, and the retained-log guard's
arithmetic (the live readers are tested per source under tests/integration/*/test_metrics.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core import retained as rl
from airflow_cdc.core.errors import ConfigError, RetainedLogExceeded
from airflow_cdc.core.metrics import CATALOG, MetricsFile, MetricsRecorder, export, parse_tags
from airflow_cdc.core.pipeline import build_config


def _config(tmp_path: Path, **props: Any) -> Any:
    return build_config(
        {
            "name": "shop",
            "connector": "postgresql",
            "staging.path": str(tmp_path),
            "database.dbname": "d",
            **props,
        }
    )


def test_custom_metric_tags_are_pairs_and_bad_ones_name_the_property(tmp_path: Path) -> None:
    assert parse_tags("database=salesdb-streaming, table=inventory") == {
        "database": "salesdb-streaming",
        "table": "inventory",
    }
    for bad in ("novalue", "=x", "a=1,a=2"):
        with pytest.raises(ConfigError, match="'custom.metric.tags'"):
            _config(tmp_path, **{"custom.metric.tags": bad})


def test_statistics_metrics_follow_the_seed_default(tmp_path: Path) -> None:
    assert _config(tmp_path)["statistics.metrics.enabled"] is False
    assert _config(tmp_path)["retained.log.max.fraction"] == 0.8


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float, dict[str, str]]] = []

    def gauge(self, name: str, value: float, tags: dict[str, str]) -> None:
        self.sent.append(("gauge", name, value, tags))

    def timing(self, name: str, ms: float, tags: dict[str, str]) -> None:
        self.sent.append(("timing", name, ms, tags))


def test_points_carry_debezium_names_the_context_table_and_custom_tags(tmp_path: Path) -> None:
    config = _config(tmp_path, **{"topic.prefix": "srv", "custom.metric.tags": "env=prod"})
    rec = MetricsRecorder(config)
    rec.set("streaming", "TotalNumberOfEventsSeen", 6)
    rec.set("streaming", "TotalNumberOfEventsSeen", 4, "public.a")
    rec.set("snapshot", "SnapshotRunning", True)
    rec.set("streaming", "LastEvent", "public.a at position 00")  # text: status only
    rec.set("commit", "DurationMs", 12.5)
    rec.set("streaming", "MilliSecondsBehindSource", None)  # unknown: left out
    sink = Sink()
    assert export(rec, sink) == 4
    base = {"connector": "shop", "server": "srv", "env": "prod"}
    assert (
        "gauge",
        "airflow_cdc.streaming.TotalNumberOfEventsSeen",
        6.0,
        {**base, "context": "streaming"},
    ) in sink.sent
    per_table = {**base, "context": "streaming", "table": "public.a"}
    assert ("gauge", "airflow_cdc.streaming.TotalNumberOfEventsSeen", 4.0, per_table) in sink.sent
    assert (
        "gauge",
        "airflow_cdc.snapshot.SnapshotRunning",
        1.0,
        {**base, "context": "snapshot"},
    ) in sink.sent
    assert ("timing", "airflow_cdc.commit.DurationMs", 12.5, {**base, "context": "commit"}) in sink.sent
    doc = rec.to_json()
    assert doc["streaming"]["tables"]["public.a"]["TotalNumberOfEventsSeen"] == 4
    assert "MilliSecondsBehindSource" not in doc["streaming"]
    copy = MetricsRecorder(config)
    copy.merge_json(doc)
    assert copy.to_json() == doc
    with pytest.raises(KeyError):
        rec.set("streaming", "NoSuchMetric", 1)


def test_a_failing_sink_never_fails_the_step(tmp_path: Path) -> None:
    class Broken(Sink):
        def gauge(self, name: str, value: float, tags: dict[str, str]) -> None:
            raise OSError("network down")

    rec = MetricsRecorder(_config(tmp_path))
    rec.set("streaming", "Connected", 1)
    assert export(rec, Broken()) == 0


def test_catalog_names_are_unique_and_stat_safe() -> None:
    keys = [(m.context, m.name) for m in CATALOG]
    assert len(keys) == len(set(keys))
    assert all(m.name.isalnum() and m.kind in ("gauge", "timing", "info") for m in CATALOG)


def test_metrics_file_keeps_each_steps_last_section(tmp_path: Path) -> None:
    config = _config(tmp_path)
    rec = MetricsRecorder(config)
    rec.set("apply", "BatchesApplied", 2)
    MetricsFile(config).save("apply", rec, batch_id="b1")
    rec2 = MetricsRecorder(config)
    rec2.set("commit", "DurationMs", 3)
    MetricsFile(config).save("commit", rec2, batch_id="b1")
    doc = MetricsFile(config).load()
    assert doc["apply"]["metrics"] == {"apply": {"BatchesApplied": 2}} and doc["apply"]["batch_id"] == "b1"
    assert doc["commit"]["metrics"]["commit"]["DurationMs"] == 3 and doc["commit"]["at"] > 0
    path = tmp_path / "shop" / "metrics.json"
    assert json.loads(path.read_text()) == doc and not list(tmp_path.glob("shop/*.tmp"))
    path.write_text("{ damaged")
    assert MetricsFile(config).load() == {}  # a damaged file only loses metrics


@pytest.mark.parametrize(
    ("props", "retained", "age", "tripped", "why"),
    [
        ({}, rl.RetainedLog(retained_bytes=700, limit_bytes=1000), None, False, ""),
        (
            {},
            rl.RetainedLog(retained_bytes=800, limit_bytes=1000),
            None,
            True,
            "retained.log.max.fraction=0.8",
        ),
        (
            {"retained.log.max.fraction": 0},
            rl.RetainedLog(retained_bytes=999, limit_bytes=1000),
            None,
            False,
            "",
        ),
        (
            {"retained.log.max.bytes": 500},
            rl.RetainedLog(retained_bytes=600, limit_bytes=1000),
            None,
            True,
            "retained.log.max.bytes=500",
        ),
        (
            {"retained.log.max.bytes": 900},
            rl.RetainedLog(retained_bytes=850, limit_bytes=1000),
            None,
            True,
            "retained.log.max.fraction=0.8",
        ),  # the smaller limit applies
        ({}, rl.RetainedLog(retained_bytes=10**12), None, False, ""),  # unlimited server, no explicit limit
        (
            {},
            rl.RetainedLog(limit_age_ms=3_600_000),
            2_900_000,
            True,
            "the committed position is 48.3 min old",
        ),
        ({"retained.log.max.age.ms": 1000}, None, 999, False, ""),
        ({"retained.log.max.age.ms": 1000}, None, 1000, True, "retained.log.max.age.ms=1000"),
        ({}, rl.RetainedLog(retained_bytes=1, wal_status="unreserved"), None, True, "(unreserved)"),
        ({}, rl.RetainedLog(lost=True, detail="binlog x is purged"), None, True, "binlog x is purged"),
    ],
)
def test_guard_limits(tmp_path: Path, props: dict, retained: Any, age: Any, tripped: bool, why: str) -> None:
    config = _config(tmp_path, **props)
    verdict = rl.evaluate(config, retained, age)
    assert verdict.tripped is tripped
    assert why in verdict.message
    if tripped:
        with pytest.raises(RetainedLogExceeded, match="connector 'shop'"):
            rl.check(config, retained, age)


def test_guard_records_its_limits_and_use(tmp_path: Path) -> None:
    config = _config(tmp_path, **{"retained.log.max.age.ms": 10_000})
    retained = rl.RetainedLog(
        retained_bytes=400, behind_bytes=300, lag_bytes=200, limit_bytes=1000, wal_status="reserved"
    )
    rec = MetricsRecorder(config)
    rl.record(rec, retained, 5_000, rl.evaluate(config, retained, 5_000))
    doc = rec.to_json()
    assert doc["source"]["RetainedLogLimitBytes"] == 800 and doc["source"]["RetainedLogLimitAgeMs"] == 10_000
    assert doc["source"]["RetainedLogUsedFraction"] == 0.5 and doc["source"]["RetainedLogGuardTripped"] == 0
    assert doc["silver"]["LagBytes"] == 200 and doc["source"]["WalStatus"] == "reserved"


def test_the_monitoring_docs_list_every_metric() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "operations" / "metrics.md").read_text()
    missing = [f"{m.context}.{m.name}" for m in CATALOG if f"| `{m.context}` | `{m.name}` |" not in page]
    assert not missing, f"docs/operations/metrics.md lacks {missing}"
