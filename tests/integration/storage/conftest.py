"""The staging stores every contract test runs on: a local directory, a bucket on s3proxy, a
bucket on fake-gcs-server and a container on Azurite (one server of each per session)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_cdc.testing.azurite import AzuriteServer, azurite_binary
from airflow_cdc.testing.fake_gcs import FakeGcsServer, fake_gcs_binary
from airflow_cdc.testing.s3proxy import S3ProxyServer, s3proxy_jar

STORES = ["local", "s3", "gcs", "azure"]


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3ProxyServer]:
    """One s3proxy for the session (skips, saying why, without its jar or Java)."""
    if s3proxy_jar() is None:
        pytest.skip("s3proxy jar or java missing: run `make setup`")
    with S3ProxyServer() as server:
        yield server


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[FakeGcsServer]:
    """One fake-gcs-server for the session (skips, saying why, without its binary)."""
    if fake_gcs_binary() is None:
        pytest.skip("fake-gcs-server missing: run `make fake-gcs` (needs go)")
    with FakeGcsServer() as server:
        yield server


@pytest.fixture(scope="session")
def azure_server() -> Iterator[AzuriteServer]:
    """One Azurite for the session (skips, saying why, without it or Node)."""
    if azurite_binary() is None:
        pytest.skip("Azurite or node missing: run `make azurite` (needs npm)")
    with AzuriteServer() as server:
        yield server


def store_root(request: pytest.FixtureRequest, kind: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket (container) on the session's server of ``kind``, as a staging URL, with
    the server's settings in the environment as a deployment gives them."""
    if kind == "s3":
        s3: S3ProxyServer = request.getfixturevalue("s3_server")
        env, url = s3.env(), f"s3a://{s3.make_bucket()}/staging"
    elif kind == "gcs":
        gcs: FakeGcsServer = request.getfixturevalue("gcs_server")
        env, url = gcs.env(), f"gs://{gcs.make_bucket()}/staging"
    else:
        azure: AzuriteServer = request.getfixturevalue("azure_server")
        # Hadoop's URL form; az:// (the account from the environment) in test_locations
        env = azure.env()
        url = f"abfss://{azure.make_container()}@{azure.account}.dfs.core.windows.net/staging"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return url


@pytest.fixture(params=STORES)
def staging(request: pytest.FixtureRequest, tmp_path, monkeypatch) -> str:
    """A fresh staging root: a directory, or ``s3a://`` / ``gs://`` / ``abfss://`` URL of a new
    bucket (credentials and endpoint in the environment, as a deployment gives them)."""
    if request.param == "local":
        return str(tmp_path / "staging")
    return store_root(request, request.param, monkeypatch)
