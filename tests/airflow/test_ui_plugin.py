"""Unit tests of the CDC panel plugin: its registration, the fields Airflow validates, the capture
tasks found in a serialized DAG, the page, and its routes' refusal of a caller without a session.
The browser test against a running Airflow is ``test_live_airflow.py``'s CDC tab test."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from airflow_cdc.airflow.ui.page import render

DOC = {
    "tags": {"connector": "shop"},
    "last": {
        "capture": {
            "at": 1_700_000_000.0,
            "batch_id": "00000000000000000007",
            "metrics": {
                "capture": {"DurationMs": 1234.5},
                "snapshot": {
                    "SnapshotRunning": 1,
                    "TotalTableCount": 2,
                    "RemainingTableCount": 1,
                    "ChunkTo": "<100>",
                    "tables": {"public.orders": {"RowsScanned": 100}, "public.customers": {"RowsScanned": 50}},
                },
            },
        },
    },
    "now": {
        "silver": {"LagMs": 90_500},
        "source": {"RetainedLogBytes": 3 << 20, "WalStatus": "reserved", "RetainedLogUsedFraction": 0.25},
        "staging": {"BatchesStaged": 3, "BatchesNotApplied": 1},
        "streaming": {"Connected": 1},
    },
    "guard": {"tripped": False, "message": None, "used_fraction": 0.25},
}


def _pipelines(**item):
    return {"generated_at": 1_700_000_100.0, "live": True, "ttl_seconds": 10.0, "pipelines": [item]}


def test_entry_point_and_fields_airflow_validates():
    from airflow.api_fastapi.app import RESERVED_URL_PREFIXES
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

    [ep] = [e for e in entry_points(group="airflow.plugins") if e.value.startswith("airflow_cdc")]
    plugin = ep.load()()
    assert plugin.name == "airflow_cdc"
    for view in plugin.external_views:
        ExternalViewResponse.model_validate(view)  # destination, url_route ... as the UI expects
        assert not view["href"].startswith("/")  # relative to the UI's base URL
    assert {v["destination"] for v in plugin.external_views} == {"dag", "nav"}
    [app] = plugin.fastapi_apps
    assert not any(app["url_prefix"].startswith(p) for p in RESERVED_URL_PREFIXES)


def test_capture_tasks_of_a_serialized_dag(tmp_path):
    from airflow.serialization.serialized_objects import DagSerialization

    from airflow_cdc.airflow.dag_factory import cdc_dag
    from airflow_cdc.airflow.ui.pipelines import PipelineRef, refs_of

    path = tmp_path / "shop.yaml"
    path.write_text(
        f"name: shop\nconnector: postgresql\nstaging.path: {tmp_path}\n"
        "airflow:\n  cdc_conn_id: pg\n  apply: false\n"
    )
    dag = DagSerialization.from_dict(DagSerialization.to_dict(cdc_dag(str(path))))
    assert refs_of(dag) == [PipelineRef("cdc_shop", "capture", str(path), "pg", None)]


def test_page_shows_values_with_their_metric_names():
    html = render("CDC pipeline of cdc_shop", _pipelines(
        dag_id="cdc_shop", task_id="capture", partition=None, connector="shop", offset={"lsn": "0/1"},
        updated_at="2026-01-01", metrics=DOC,
    ))  # fmt: skip
    assert 'data-metric="silver.LagMs" data-value="90500">90.5 s<' in html
    assert 'data-metric="source.RetainedLogBytes" data-value="3145728">3.0 MiB (3,145,728 B)<' in html
    assert 'data-metric="snapshot.RemainingTableCount" data-value="1">1<' in html
    assert 'data-metric="snapshot.State" data-value="running">running<' in html
    assert "Rows scanned: public.orders</th><td data-metric=\"snapshot.RowsScanned\" data-value=\"100\">" in html
    assert "&lt;100&gt;" in html and "<100>" not in html  # values are escaped
    assert 'class="ok" data-metric="guard">Guard: within limits' in html
    assert "<script" not in html and "http:" not in html and "https:" not in html  # no script, no CDN


def test_page_shows_a_pipeline_that_cannot_be_read_and_saved_values():
    error = _pipelines(dag_id="d", task_id="capture", partition="db1", error="ConfigError: <bad>")
    assert 'class="bad" data-metric="error">ConfigError: &lt;bad&gt;<' in render("t", error)
    saved = {**DOC, "now": {"silver": {"LagMs": 5}}, "guard": None}
    del saved["guard"]
    saved["last"] = {**DOC["last"], "sensor": {"at": 1_700_000_050.0, "tripped": True, "message": "too much",
                                               "metrics": {"source": {"RetainedLogBytes": 7}}}}  # fmt: skip
    html = render("t", _pipelines(dag_id="d", task_id="capture", partition=None, metrics=saved))
    assert 'data-metric="source.RetainedLogBytes" data-value="7">7 B<' in html and "saved by sensor" in html


@pytest.mark.parametrize("path", ["/api/dags/cdc_shop", "/api/dags", "/dags/cdc_shop", "/"])
def test_routes_refuse_a_caller_without_a_session(path):
    from fastapi.testclient import TestClient

    from airflow_cdc.airflow.ui.app import app

    assert TestClient(app).get(path).status_code == 401
