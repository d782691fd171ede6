"""GCS and Azure locations without a server: the URL forms (Hadoop's and the Python
libraries'), where their settings come from (environment, Hadoop keys, connection strings),
secrets kept out of sight, and the apply job's own reading of the same URLs (delta_log)."""

from __future__ import annotations

import pytest

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.storage import AzureSettings, GcsSettings, open_location, python_url
from airflow_cdc.core.storage.settings import parse_connection_string
from spark_jobs.cdc_apply import delta_log

KEY = "a2V5LW9mLXRoZS1hY2NvdW50LWZvci10ZXN0cy0xMjM0NTY3OA=="  # base64, as account keys are
AZURE = AzureSettings(account_name="acct", endpoint="http://127.0.0.1:9/acct", account_key=KEY)
GCS = GcsSettings(endpoint="http://127.0.0.1:9", anonymous=True)


@pytest.fixture(autouse=True)
def _no_cloud_environment(monkeypatch):
    for key in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_KEY",
                "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_ENDPOINT",
                "AZURE_STORAGE_CONNECTION_STRING", "STORAGE_EMULATOR_HOST",
                "CLOUD_STORAGE_EMULATOR_ENDPOINT"):  # fmt: skip
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(delta_log, "_GCS", {})
    monkeypatch.setattr(delta_log, "_AZURE", {})


def test_gcs_url_forms():
    loc = open_location("gcs://bucket/a/b/", GCS)
    assert loc.url == "gs://bucket/a/b" and loc.path == "bucket/a/b" and not loc.local and not loc.renames
    assert (loc / "x").url == "gs://bucket/a/b/x" and open_location(loc.url, GCS).store is loc.store
    assert "GCS bucket 'bucket' at http://127.0.0.1:9" == loc.store.describe()
    assert python_url("gcs://b/k") == "gs://b/k" and python_url("gs://b/k") == "gs://b/k"
    assert delta_log.hadoop_url("gcs://b/k") == "gs://b/k" and delta_log.hadoop_url("gs://b/k") == "gs://b/k"


def test_azure_url_forms(monkeypatch):
    hadoop = open_location("abfss://box@acct.dfs.core.windows.net/a/b/", AZURE)
    assert hadoop.url == "abfss://box@acct.dfs.core.windows.net/a/b" and hadoop.path == "box/a/b"
    for same in ("abfs://box@acct.dfs.core.windows.net/a/b", "az://box/a/b", "abfss://box/a/b"):
        loc = open_location(same, AZURE)  # Hadoop without TLS; adlfs' forms (account from settings)
        assert loc.url == hadoop.url and loc.store is hadoop.store
    assert python_url(hadoop.url) == hadoop.url  # pyarrow, obstore and adlfs read it as it is
    assert hadoop.store.describe() == "Azure container 'box' of account 'acct' at http://127.0.0.1:9/acct"
    with pytest.raises(ConfigError, match="az://box/ names no storage account"):
        open_location("az://box/a")
    # another account than the settings': their key and endpoint are not for it
    other = open_location("abfss://box@other.dfs.core.windows.net/a", AZURE).store
    assert other.settings.account_name == "other" and other.settings.account_key is None  # type: ignore[attr-defined]
    assert other.settings.endpoint is None  # type: ignore[attr-defined]
    # a national cloud's suffix in the URL gives the endpoint
    china = open_location("abfss://box@acct.dfs.core.chinacloudapi.cn/a", AzureSettings(account_key=KEY))
    assert china.url == "abfss://box@acct.dfs.core.chinacloudapi.cn/a"
    assert china.store.settings.endpoint == "https://acct.blob.core.chinacloudapi.cn"  # type: ignore[attr-defined]
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    assert delta_log.hadoop_url("az://box/a/b") == "abfss://box@acct.dfs.core.windows.net/a/b"
    assert delta_log.hadoop_url(hadoop.url) == hadoop.url


def test_settings_of_another_store_are_ignored(monkeypatch):
    """submit.py hands S3 settings to every location: a gs:// one reads its own environment."""
    from airflow_cdc.core.storage import StorageSettings

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9")
    store = open_location("gs://bucket/x", StorageSettings(region="eu-west-1")).store
    assert store.settings == GcsSettings(endpoint="http://127.0.0.1:9", anonymous=True)  # type: ignore[attr-defined]


def test_gcs_settings_sources():
    emulator = GcsSettings.from_env({"STORAGE_EMULATOR_HOST": "localhost:4443", "GOOGLE_CLOUD_PROJECT": "p"})
    assert emulator == GcsSettings(endpoint="http://localhost:4443", project_id="p", anonymous=True)
    adc = GcsSettings.from_env({"GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json"})
    assert adc == GcsSettings(credentials_file="/keys/sa.json") and not adc.anonymous
    hadoop = GcsSettings.from_hadoop(
        {
            "spark.hadoop.fs.gs.storage.root.url": "http://127.0.0.1:4443",
            "fs.gs.auth.type": "UNAUTHENTICATED",
            "fs.gs.project.id": "p",
            "fs.s3a.endpoint": "http://minio:9000",  # another store's
        }
    )
    assert hadoop == GcsSettings(endpoint="http://127.0.0.1:4443", project_id="p", anonymous=True)
    assert hadoop.hadoop_conf()["spark.hadoop.fs.gs.auth.type"] == "UNAUTHENTICATED"
    assert GcsSettings.from_hadoop(adc.hadoop_conf()) == adc
    assert adc.env() == {"GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json"} and adc.secrets == []
    assert emulator.env()["STORAGE_EMULATOR_HOST"] == "http://localhost:4443"
    assert GcsSettings(project_id="q").over(emulator).project_id == "q"


def test_gcs_key_file_must_agree_with_the_environment(monkeypatch):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/keys/a.json")
    with pytest.raises(ConfigError, match="GOOGLE_APPLICATION_CREDENTIALS names /keys/a.json"):
        open_location("gs://bucket/x", GcsSettings(credentials_file="/keys/b.json"))


def test_azure_settings_sources_and_secrets():
    conn = (
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey="
        + KEY
        + ";EndpointSuffix=core.windows.net"
    )
    from_conn = AzureSettings.from_env({"AZURE_STORAGE_CONNECTION_STRING": conn})
    assert from_conn == AzureSettings(
        account_name="acct", account_key=KEY, endpoint="https://acct.blob.core.windows.net"
    )
    azurite = parse_connection_string("UseDevelopmentStorage=true")
    assert azurite["account_name"] == "devstoreaccount1"
    assert azurite["endpoint"] == "http://127.0.0.1:10000/devstoreaccount1"
    with pytest.raises(ConfigError, match="a part is not key=value") as bad:
        parse_connection_string("AccountName=acct;half-pasted-secret")
    assert "half-pasted-secret" not in str(bad.value)
    env = AzureSettings.from_env(
        {
            "AZURE_STORAGE_ACCOUNT": "acct",
            "AZURE_STORAGE_KEY": KEY,
            "AZURE_STORAGE_ENDPOINT": "http://h:1/acct",
        }
    )
    assert env == AzureSettings(account_name="acct", account_key=KEY, endpoint="http://h:1/acct")
    assert AzureSettings.from_env(env.env()) == env  # what a child process gets back
    suffix = "acct.dfs.core.windows.net"
    hadoop = AzureSettings.from_hadoop(
        {
            f"spark.hadoop.fs.azure.account.key.{suffix}": KEY,
            "fs.azure.account.oauth2.client.id": "app-id",
            "fs.azure.account.oauth2.client.secret": "app-secret",
            "fs.azure.account.oauth2.client.endpoint": "https://login.microsoftonline.com/tenant-1/oauth2/token",
        }
    )
    assert hadoop.account_name == "acct" and hadoop.account_key == KEY and hadoop.tenant_id == "tenant-1"
    assert hadoop.client_id == "app-id" and hadoop.client_secret == "app-secret"
    with pytest.raises(ConfigError, match=r"name accounts \['a1', 'a2'\]"):
        AzureSettings.from_hadoop(
            {f"fs.azure.account.key.{a}.dfs.core.windows.net": KEY for a in ("a1", "a2")}
        )
    only_a2 = AzureSettings.from_hadoop(
        {f"fs.azure.account.key.{a}.dfs.core.windows.net": a for a in ("a1", "a2")}, "a2"
    )
    assert only_a2.account_key == "a2"
    shown = f"{hadoop!r} {hadoop.describe()} {hadoop.hadoop_conf()}"
    assert KEY not in shown and "app-secret" not in shown
    assert hadoop.hadoop_conf()[f"spark.hadoop.fs.azure.account.auth.type.{suffix}"] == "SharedKey"
    assert sorted(hadoop.secrets) == sorted([KEY, "app-secret"])
    sas = AzureSettings(account_name="acct", sas_token="?sv=2024&sig=c2lnbmF0dXJl")
    store = open_location("az://box/x", sas).store
    said = store.scrub("PUT http://h/acct/box/x?sv=2024&sig=c2lnbmF0dXJl failed; sig=c2lnbmF0dXJl")
    assert "c2lnbmF0dXJl" not in said and "PUT http://h/acct/box/x?..." in said


def test_apply_job_reads_gcs_and_azure_from_hadoop_keys(monkeypatch):
    """The apply job's own reader (no Airflow, no Spark) takes the same Hadoop keys as Spark."""
    delta_log.use_hadoop_conf(
        {
            "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net": KEY,
            "fs.gs.storage.root.url": "http://127.0.0.1:9",
            "fs.gs.auth.type": "UNAUTHENTICATED",
            "fs.azure.account.oauth2.client.endpoint": "https://login.microsoftonline.com/t-9/oauth2/token",
        }
    )
    assert delta_log._AZURE == {"acct": {"account_key": KEY}, None: {"tenant_id": "t-9"}}
    fs, path = delta_log.filesystem("abfss://box@acct.dfs.core.windows.net/delta/t")
    assert fs.type_name == "abfs" and path == "box/delta/t"
    fs, path = delta_log.filesystem("gs://bucket/delta/t")
    assert fs.type_name == "gcs" and path == "bucket/delta/t"
    assert (
        delta_log.hadoop_url("az://box/t") == "abfss://box@acct.dfs.core.windows.net/t"
    )  # the keys' account
    with pytest.raises(ValueError, match="AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.setattr(delta_log, "_AZURE", {})
        delta_log.filesystem("az://box/t")


def test_put_if_absent_retries_a_conflicting_conditional_write(monkeypatch):
    """AWS answers a put-if-absent that meets another conditional write of the key in flight with
    ``409 ConditionalRequestConflict`` and asks for a retry: the retry then sees the winner (412,
    exists) or wins itself.  Only that answer is retried; others fail at once, secrets scrubbed."""
    import obstore
    import obstore.exceptions as oe

    from airflow_cdc.core.storage import stores
    from airflow_cdc.core.storage.settings import StorageSettings

    store = stores.S3Store(
        "bkt", StorageSettings(endpoint="http://127.0.0.1:9", access_key="AK", secret_key="s3cr3t-value")
    )
    monkeypatch.setattr(store, "_client", lambda: object())
    monkeypatch.setattr(stores.time, "sleep", lambda s: None)
    conflict = oe.GenericError(
        "Generic S3 error: Error performing PUT http://127.0.0.1:9/bkt/m.json in 3ms - Server returned "
        "non-2xx status code: 409 Conflict: <Code>ConditionalRequestConflict</Code>\nDebug dump"
    )
    answers: list[Exception | None] = [conflict, conflict, None]
    calls: list[str] = []

    def put(client, key, data, mode):
        calls.append(key)
        answer = answers.pop(0)
        if answer is not None:
            raise answer

    monkeypatch.setattr(obstore, "put", put)
    store.create("bkt/m.json", b"{}")
    assert calls == ["m.json"] * 3
    answers[:] = [conflict, oe.AlreadyExistsError("412 Precondition Failed")]
    with pytest.raises(FileExistsError, match="s3://bkt/m.json exists"):
        store.create("bkt/m.json", b"{}")
    answers[:] = [conflict] * (stores.CREATE_CONFLICT_RETRIES + 1)
    with pytest.raises(OSError, match="409 Conflict"):
        store.create("bkt/m.json", b"{}")
    assert not answers
    answers[:] = [oe.GenericError("Server returned 403 Forbidden for s3cr3t-value"), None]
    with pytest.raises(OSError) as failed:
        store.create("bkt/m.json", b"{}")
    assert "s3cr3t-value" not in str(failed.value) and len(answers) == 1  # not retried
