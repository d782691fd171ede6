"""Locations and store settings: URL forms, where settings come from, secrets kept out of sight,
and a stopped S3 / GCS / Azure server giving a retryable error that names the store, with
nothing published.  (The GCS and Azure URL forms and settings, which need no server, are in
tests/unit/core/test_storage_locations.py.)"""

from __future__ import annotations

import pytest

from airflow_cdc.core.batch import BatchWriter, batches_at, clean_incomplete, list_batches
from airflow_cdc.core.errors import ConfigError, StorageUnavailable
from airflow_cdc.core.storage import StorageSettings, is_remote, open_location, python_url
from airflow_cdc.testing.azurite import AzuriteServer, azurite_binary
from airflow_cdc.testing.fake_gcs import FakeGcsServer, fake_gcs_binary
from airflow_cdc.testing.s3proxy import S3ProxyServer, s3proxy_jar
from tests.integration.storage.test_staging_contract import _WRITERS, _writer

#: a fresh server of each kind (the test stops it), how to make a bucket on it, what its errors
#: call it, and whether its objects survive a SIGKILL: Azurite keeps its metadata in LokiJS,
#: saved every few seconds, and an object written just before the kill was gone after the
#: restart (seen with 3.35.0), so nothing is left to sweep there
SERVERS = {
    "s3": (S3ProxyServer, s3proxy_jar, lambda s: f"s3a://{s.make_bucket()}/staging", "S3 bucket", True),
    "gcs": (FakeGcsServer, fake_gcs_binary, lambda s: f"gs://{s.make_bucket()}/staging", "GCS bucket", True),
    "azure": (
        AzuriteServer,
        azurite_binary,
        lambda s: f"az://{s.make_container()}/staging",
        "Azure container",
        False,
    ),
}


def test_urls_and_schemes(tmp_path):
    s3a = open_location("s3a://bucket/a/b/", StorageSettings(region="eu-west-1"))
    assert s3a.url == "s3://bucket/a/b" and (s3a / "x").url == "s3://bucket/a/b/x" and not s3a.local
    assert python_url("s3a://b/k") == "s3://b/k" and python_url("/tmp/x") == "/tmp/x"
    local = open_location(tmp_path / "staging")
    assert local.local and local.url == str(tmp_path / "staging") and local.renames
    assert is_remote("s3://b/k") and not is_remote("file:///tmp/x") and not is_remote(tmp_path)
    assert is_remote("gs://b/k") and is_remote("abfss://c@a.dfs.core.windows.net/k")
    with pytest.raises(ConfigError, match=r"scheme 'hdfs' is not supported; use a local path, s3://"):
        open_location("hdfs://namenode/x")
    for url in ("s3:///x", "gs:///x", "abfss://@acct.dfs.core.windows.net/x"):
        with pytest.raises(ConfigError, match="needs a bucket"):
            open_location(url)


def test_settings_sources_and_secrets():
    env = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_REGION": "eu-west-1"}
    from_env = StorageSettings.from_env(env)
    hadoop = StorageSettings.from_hadoop(
        {"spark.hadoop.fs.s3a.endpoint": "http://minio:9000", "fs.s3a.path.style.access": "true"}
    )
    merged = hadoop.over(from_env)
    assert merged.endpoint == "http://minio:9000" and merged.access_key == "AKIAEXAMPLE" and merged.path_style
    shown = f"{merged!r} {merged.describe()} {merged.hadoop_conf()}"
    assert "s3cr3t" not in shown and "AKIAEXAMPLE" not in shown
    assert merged.hadoop_conf()["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert merged.env() == {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_REGION": "eu-west-1",
    }
    assert sorted(merged.secrets) == ["AKIAEXAMPLE", "s3cr3t"]


@pytest.mark.parametrize("kind", list(SERVERS))
def test_store_stopped_between_parts_and_manifest(monkeypatch, kind):
    """The store's server dies after the parts and before the manifest: a retryable error naming
    the store, nothing published; after a restart the leftover is swept and the next run
    publishes."""
    server_class, present, make_root, called, survives = SERVERS[kind]
    if present() is None:
        pytest.skip(f"{server_class.__name__} missing: run `make setup`")
    with server_class() as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        staging = make_root(server)
        w = _writer(staging, owner={"host": "elsewhere", "pid": 1, "token": 1})
        for table in ("public.a", "public.b"):
            w.close_table(table)
        server.stop()
        with pytest.raises(StorageUnavailable) as failed:
            w.finish({})
        assert failed.value.retryable and f"127.0.0.1:{server.port}" in str(failed.value)
        assert called in str(failed.value)
        for secret in server.settings.secrets:
            assert secret not in str(failed.value)
        with pytest.raises(StorageUnavailable):
            list_batches(staging, "conn")
        server.start()
        if not survives:  # the container went with the rest
            server.make_container(staging.split("://")[1].split("/")[0])
        assert list_batches(staging, "conn") == []
        assert clean_incomplete(staging, "conn", token=2) == (1 if survives else 0)
        assert not batches_at(staging, "conn").walk()
        again = BatchWriter(staging, "conn", piece_rows=16)
        again.finish({})
        assert [b.batch_id for b in list_batches(staging, "conn")] == [again.batch_id]
        _WRITERS.remove(w)  # dropped while its server runs (the contract suite's teardown would
        w.abort()  # retry against the stopped one for as long as each client retries)


@pytest.mark.skipif(s3proxy_jar() is None, reason="s3proxy jar or java missing: run `make setup`")
def test_apply_job_on_s3_gets_s3a_settings_and_credentials_by_environment(monkeypatch, tmp_path):
    from airflow_cdc.apply.submit import build_apply_job

    with S3ProxyServer() as server:
        for key, value in server.env().items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AIRFLOW_CDC_DELTA_JARS", str(tmp_path))
        (tmp_path / "delta.jar").touch()
        bucket = server.make_bucket()
        path = _writer(f"s3a://{bucket}/staging").finish({})
        job = build_apply_job(str(path), f"s3a://{bucket}/delta")
        assert job.conf["spark.hadoop.fs.s3a.endpoint"] == server.endpoint
        assert job.conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
        assert job.env["AWS_SECRET_ACCESS_KEY"] == server.secret_key
        assert server.secret_key not in " ".join(job.command())
        with pytest.raises(Exception, match="not a published batch"):
            build_apply_job(f"s3a://{bucket}/staging/conn/batches/nothing", f"s3a://{bucket}/delta")


def test_settings_from_an_airflow_aws_connection():
    conn = StorageSettings.from_aws_connection(
        "AKIAEXAMPLE", "s3cr3t", {"endpoint_url": "http://minio:9000", "region_name": "eu-west-1"}
    )
    assert conn.endpoint == "http://minio:9000" and conn.region == "eu-west-1" and conn.use_path_style
    assert conn.over(StorageSettings(region="us-east-1", session_token="tok")).session_token == "tok"
    assert (
        "s3cr3t" not in repr(conn)
        and StorageSettings.from_aws_connection(None, None, None) == StorageSettings()
    )


def test_apply_job_store_failure_is_retryable_and_names_the_store():
    import importlib.util
    import sys

    from airflow_cdc.apply.submit import apply_exit_error, spark_jobs_dir

    err = apply_exit_error(7, "b-1", "s3a://lake/delta")
    assert isinstance(err, StorageUnavailable) and err.retryable and "s3a://lake/delta" in str(err)
    sys.path.insert(0, str(spark_jobs_dir()))
    try:
        spec = importlib.util.spec_from_file_location("apply_changes", spark_jobs_dir() / "apply_changes.py")
        job = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(job)
    finally:
        sys.path.remove(str(spark_jobs_dir()))
    down = OSError("When reading information for key 'x' in bucket 'lake': AWS Error NETWORK_CONNECTION")
    try:
        raise RuntimeError("Py4JJavaError") from down
    except RuntimeError as wrapped:
        assert job._store_failed(wrapped)
    assert not job._store_failed(ValueError("bad value"))


@pytest.mark.parametrize("kind", ["gcs", "azure"])
def test_apply_job_on_gcs_and_azure_gets_their_hadoop_settings(request, monkeypatch, tmp_path, kind):
    """A batch staged on GCS / ADLS: the job gets the GCS connector's / hadoop-azure's settings
    and the environment its own log reads need; no secret on its command line or in its conf."""
    from airflow_cdc.apply.submit import build_apply_job
    from tests.integration.storage.conftest import store_root

    monkeypatch.setenv("AIRFLOW_CDC_DELTA_JARS", str(tmp_path))
    (tmp_path / "delta.jar").touch()
    root = store_root(request, kind, monkeypatch)
    path = _writer(root).finish({})
    job = build_apply_job(str(path), root.rsplit("/", 1)[0] + "/delta")
    shown = " ".join(job.command()) + repr(job.conf)
    if kind == "gcs":
        assert job.conf["spark.hadoop.fs.gs.impl"].endswith("GoogleHadoopFileSystem")
        assert job.conf["spark.hadoop.fs.gs.auth.type"] == "UNAUTHENTICATED"
        assert "STORAGE_EMULATOR_HOST" in job.env
    else:
        server = request.getfixturevalue("azure_server")
        suffix = f".{server.account}.dfs.core.windows.net"
        assert job.conf[f"spark.hadoop.fs.azure.account.auth.type{suffix}"] == "SharedKey"
        assert server.account_key not in shown
    assert not any(k.startswith("spark.hadoop.fs.s3a.") for k in job.conf)
