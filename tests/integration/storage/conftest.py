"""The staging stores every contract test runs on: a local directory and a bucket on s3proxy."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_cdc.testing.s3proxy import S3ProxyServer, s3proxy_jar


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3ProxyServer]:
    """One s3proxy for the session (skips, saying why, without its jar or Java)."""
    if s3proxy_jar() is None:
        pytest.skip("s3proxy jar or java missing: run `make setup`")
    with S3ProxyServer() as server:
        yield server


@pytest.fixture(params=["local", "s3"])
def staging(request: pytest.FixtureRequest, tmp_path, monkeypatch) -> str:
    """A fresh staging root: a directory, or ``s3a://<new bucket>/staging`` (credentials and
    endpoint in the environment, as a deployment gives them)."""
    if request.param == "local":
        return str(tmp_path / "staging")
    server: S3ProxyServer = request.getfixturevalue("s3_server")
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    return f"s3a://{server.make_bucket()}/staging"
