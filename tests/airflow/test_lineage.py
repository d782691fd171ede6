"""OpenLineage through the provider's extractor: capture reads the source tables; apply reads them
and writes the bronze and silver Delta tables (named by their storage location)."""

from __future__ import annotations

import os

import pytest
from airflow.providers.openlineage.extractors.base import DefaultExtractor

from airflow_cdc.airflow.lineage import delta_datasets, source_datasets
from airflow_cdc.airflow.operators.apply import CdcApplyOperator
from airflow_cdc.airflow.operators.capture import CdcCaptureOperator
from airflow_cdc.apply.applied import missing_tables
from airflow_cdc.core.batch import Batch
from airflow_cdc.core.pipeline import build_config
from tests.airflow.support import SHOP_TABLES, direct_props, load_shop


def names(datasets) -> set[tuple[str, str]]:
    return {(d.namespace, d.name) for d in datasets}


def test_capture_and_apply_lineage(pg_db, tmp_path):
    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging")
    ctx = {"dag_run": type("Run", (), {"conf": {}})(), "params": {}}
    capture = CdcCaptureOperator(task_id="capture", pipeline=props)
    result = capture.execute(ctx)
    server = pg_db.server
    expected_in = {(f"postgres://{server.host}:{server.port}", f"{pg_db.name}.{t}") for t in SHOP_TABLES}
    lineage = DefaultExtractor(capture).extract_on_complete(None)
    assert names(lineage.inputs) == expected_in and lineage.outputs == []

    target = str(tmp_path / "delta")
    apply = CdcApplyOperator(task_id="apply", pipeline=props, batch_path=result["batch_path"], target=target)
    apply._lineage_config = build_config(props)  # what execute sets before submitting Spark
    lineage = DefaultExtractor(apply).extract_on_complete(None)
    assert names(lineage.inputs) == expected_in
    batch = Batch(result["batch_path"])
    paths = {f"{layer}:{t}" for t in SHOP_TABLES for layer in ("bronze", "silver")}
    assert set(missing_tables(batch, target, bronze=True)) == paths  # the same locations apply checks
    assert names(lineage.outputs) == {
        ("file", os.path.join(target, layer, props["name"], t)) for t in SHOP_TABLES for layer in ("bronze", "silver")
    }


def test_dataset_names_per_source_and_store():
    base = {"name": "n", "staging.path": "/tmp/x", "database.hostname": "db.internal"}
    mysql = build_config({**base, "connector": "mysql", "database.port": 3307})
    assert names(source_datasets(mysql, ["shop.orders"])) == {("mysql://db.internal:3307", "shop.orders")}
    sqlserver = build_config({**base, "connector": "sqlserver", "database.names": "shop"})
    assert names(source_datasets(sqlserver, ["shop.dbo.orders"])) == {("mssql://db.internal:1433", "shop.dbo.orders")}
    out = delta_datasets("s3a://lake/cdc/", "n", ["public.orders"], bronze=False)
    assert names(out) == {("s3a://lake", "cdc/silver/n/public.orders")}


class FakeTi:
    def __init__(self):
        self.pushed = {}

    def xcom_push(self, key, value):
        self.pushed[key] = value


def test_extra_links_point_at_the_batch_and_the_delta_root(pg_db, tmp_path):
    from airflow.sdk.exceptions import AirflowSkipException

    from airflow_cdc.airflow.links import CdcBatchLink, CdcDeltaLink, storage_url
    from airflow_cdc.airflow.operators.commit import CdcCommitOperator

    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging dir", **{"commit.require.applied": "false"})
    ti = FakeTi()
    ctx = {"dag_run": type("Run", (), {"conf": {}})(), "params": {}, "ti": ti}
    first = CdcCaptureOperator(task_id="capture", pipeline=props).execute(ctx)
    assert ti.pushed == {CdcBatchLink().xcom_key: "file://" + first["batch_path"].replace(" ", "%20")}
    CdcCommitOperator(task_id="commit", pipeline=props, batch_path=first["batch_path"]).execute({})
    empty = CdcCaptureOperator(task_id="capture", pipeline=props).execute({**ctx, "ti": FakeTi()})
    target = str(tmp_path / "delta")
    apply = CdcApplyOperator(task_id="apply", batch_path=empty["batch_path"], target=target, skip_empty=True)
    ti = FakeTi()
    with pytest.raises(AirflowSkipException):  # an empty batch: no Spark, but the links are stored
        apply.execute({"ti": ti})
    assert ti.pushed == {
        CdcBatchLink().xcom_key: storage_url(empty["batch_path"]),
        CdcDeltaLink().xcom_key: "file://" + target,
    }
    assert storage_url("s3a://lake/cdc") == "s3a://lake/cdc"
    assert {link.name for link in CdcApplyOperator.operator_extra_links} == {"CDC batch", "Delta tables"}
    assert {link.name for link in CdcCaptureOperator.operator_extra_links} == {"CDC batch"}
