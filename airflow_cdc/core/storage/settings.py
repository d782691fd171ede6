"""Where an object store's endpoint and credentials come from, and how they reach Spark.

One settings class per kind of store: :class:`StorageSettings` (S3), :class:`GcsSettings`,
:class:`AzureSettings`.  Each reads the environment its own libraries read (``from_env``) and
Hadoop's keys for the same store (``from_hadoop``), hides its secrets from ``repr`` and
``describe`` and lists them in ``secrets``.  What follows is said of S3; the others work alike.

Three sources, the first one that names a value wins: explicit settings (the Airflow layer
builds them from a Connection, ``aws_conn_id``-style), Hadoop's S3A keys (``fs.s3a.endpoint``,
``fs.s3a.access.key`` ... as a user already writes them for Spark), then the process environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``,
``AWS_ENDPOINT_URL``).  With no keys at all the libraries' own chains run (instance profile,
web identity), so a role-based deployment configures nothing.

Secrets never appear in ``repr``, in :meth:`StorageSettings.describe`, in logs or in staged
files: Spark gets them through the environment of ``spark-submit`` (S3A's default provider chain
reads it), never on its command line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from airflow_cdc.core.errors import ConfigError
from spark_jobs.cdc_apply.delta_log import AZURE_ENV, AZURE_KEY, AZURE_NAMES, GCS_KEYS, S3A_KEYS, azure_tenant

#: Hadoop S3A keys -> setting names (the values users already give Spark): the apply job's table
HADOOP_KEYS = S3A_KEYS
ENV_KEYS = {
    "AWS_ENDPOINT_URL_S3": "endpoint",
    "AWS_ENDPOINT_URL": "endpoint",
    "AWS_REGION": "region",
    "AWS_DEFAULT_REGION": "region",
    "AWS_ACCESS_KEY_ID": "access_key",
    "AWS_SECRET_ACCESS_KEY": "secret_key",
    "AWS_SESSION_TOKEN": "session_token",
}
_SECRET = ("access_key", "secret_key", "session_token")


@dataclass(frozen=True)
class StorageSettings:
    """Endpoint and credentials of an S3-API store (all optional)."""

    endpoint: str | None = None  # e.g. http://127.0.0.1:9000; None: AWS
    region: str | None = None
    path_style: bool | None = None  # None: path style exactly when an endpoint is given
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StorageSettings:
        """Read the ``AWS_*`` variables (``AWS_ENDPOINT_URL_S3`` before ``AWS_ENDPOINT_URL``)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for key, name in ENV_KEYS.items():
            if env.get(key) and name not in values:
                values[name] = env[key]
        return cls(**values)

    @classmethod
    def from_hadoop(cls, conf: Mapping[str, str]) -> StorageSettings:
        """Read Hadoop S3A keys, with or without Spark's ``spark.hadoop.`` prefix."""
        values: dict[str, object] = {}
        for key, value in conf.items():
            name = HADOOP_KEYS.get(key.removeprefix("spark.hadoop."))
            if name is not None and value not in (None, ""):
                values[name] = str(value).lower() == "true" if name == "path_style" else str(value)
        return cls(**values)  # type: ignore[arg-type]

    @classmethod
    def from_aws_connection(
        cls, login: str | None, password: str | None, extra: Mapping[str, Any] | None
    ) -> StorageSettings:
        """Read the fields of an Airflow ``aws`` Connection as the Amazon provider lays them out
        (login = access key id, password = secret key; extra: ``endpoint_url``, ``region_name``,
        ``aws_session_token``, ``path_style``).  The Airflow layer looks the Connection up by its
        ``aws_conn_id``; nothing here imports Airflow."""
        extra = extra or {}
        endpoint = extra.get("endpoint_url") or (extra.get("service_config") or {}).get("s3", {}).get(
            "endpoint_url"
        )
        path_style = extra.get("path_style")
        return cls(
            endpoint=endpoint or None,
            region=extra.get("region_name") or None,
            path_style=None if path_style is None else str(path_style).lower() == "true",
            access_key=login or None,
            secret_key=password or None,
            session_token=extra.get("aws_session_token") or None,
        )

    def over(self, fallback: StorageSettings) -> StorageSettings:
        """These settings, with what they leave unset taken from ``fallback``."""
        mine = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        return replace(fallback, **mine)

    @property
    def use_path_style(self) -> bool:
        return self.path_style if self.path_style is not None else self.endpoint is not None

    def describe(self) -> str:
        """Where the store is, for messages: the endpoint and region, never a credential."""
        where = self.endpoint or "AWS"
        return f"{where}{f' ({self.region})' if self.region else ''}"

    def hadoop_conf(self) -> dict[str, str]:
        """``spark.hadoop.fs.s3a.*`` settings for Spark, without credentials (see :meth:`env`)."""
        conf = {"spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
        if self.endpoint:
            conf["spark.hadoop.fs.s3a.endpoint"] = self.endpoint
            if self.endpoint.startswith("http://"):
                conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
        if self.region:
            conf["spark.hadoop.fs.s3a.endpoint.region"] = self.region
        conf["spark.hadoop.fs.s3a.path.style.access"] = str(self.use_path_style).lower()
        return conf

    def env(self) -> dict[str, str]:
        """The credentials as ``AWS_*`` variables for a child process (``spark-submit``)."""
        out = {}
        for key, name in ENV_KEYS.items():
            value = getattr(self, name)
            if value and key not in ("AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
                out[key] = value
        return out

    @property
    def secrets(self) -> list[str]:
        """The secret values (to mask in anything shown)."""
        return [v for v in (getattr(self, n) for n in _SECRET) if v]


#: GCS variables: Google's client libraries read ``STORAGE_EMULATOR_HOST`` for an emulator (and
#: then send no credentials); pyarrow's (google-cloud-cpp) ``CLOUD_STORAGE_EMULATOR_ENDPOINT``;
#: Application Default Credentials come from ``GOOGLE_APPLICATION_CREDENTIALS``
GCS_ENV_KEYS = {
    "STORAGE_EMULATOR_HOST": "endpoint",
    "CLOUD_STORAGE_EMULATOR_ENDPOINT": "endpoint",
    "GOOGLE_CLOUD_PROJECT": "project_id",
    "GOOGLE_APPLICATION_CREDENTIALS": "credentials_file",
}


@dataclass(frozen=True)
class GcsSettings:
    """Endpoint and credentials of Google Cloud Storage (all optional: Application Default
    Credentials, as on Dataproc / GKE / a VM with a service account).  No field is a secret: a
    service-account key is named by its file."""

    endpoint: str | None = None  # an emulator's http://127.0.0.1:4443; None: storage.googleapis.com
    project_id: str | None = None
    credentials_file: str | None = None  # a service-account JSON key file
    anonymous: bool = False  # send no credentials (an emulator, a public bucket)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GcsSettings:
        """Read ``STORAGE_EMULATOR_HOST`` (then anonymous, as Google's libraries treat it),
        ``GOOGLE_CLOUD_PROJECT`` and ``GOOGLE_APPLICATION_CREDENTIALS``."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for key, name in GCS_ENV_KEYS.items():
            if env.get(key) and name not in values:
                values[name] = env[key]
        if "endpoint" in values and "://" not in values["endpoint"]:
            values["endpoint"] = "http://" + values["endpoint"]  # as the Go client does
        return cls(**values, anonymous="endpoint" in values)

    @classmethod
    def from_hadoop(cls, conf: Mapping[str, str]) -> GcsSettings:
        """Read the GCS connector's keys (``fs.gs.storage.root.url``, ``fs.gs.project.id``,
        ``fs.gs.auth.service.account.json.keyfile``, ``fs.gs.auth.type=UNAUTHENTICATED``)."""
        values = {GCS_KEYS[k]: str(v) for k, v in _unprefixed(conf).items() if k in GCS_KEYS and v}
        anonymous = values.pop("auth_type", "").upper() == "UNAUTHENTICATED"
        return cls(**values, anonymous=anonymous)

    def over(self, fallback: GcsSettings) -> GcsSettings:
        """These settings, with what they leave unset taken from ``fallback``."""
        mine = {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) not in (None, False)
        }
        return replace(fallback, **mine)

    def describe(self) -> str:
        """Where the store is, for messages."""
        return self.endpoint or "storage.googleapis.com"

    def hadoop_conf(self) -> dict[str, str]:
        """``spark.hadoop.fs.gs.*`` settings for Spark's GCS connector (a key file by path)."""
        conf = {"spark.hadoop.fs.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem"}
        if self.endpoint:
            conf["spark.hadoop.fs.gs.storage.root.url"] = self.endpoint
        if self.project_id:
            conf["spark.hadoop.fs.gs.project.id"] = self.project_id
        if self.anonymous:
            conf["spark.hadoop.fs.gs.auth.type"] = "UNAUTHENTICATED"
        elif self.credentials_file:
            conf["spark.hadoop.fs.gs.auth.type"] = "SERVICE_ACCOUNT_JSON_KEYFILE"
            conf["spark.hadoop.fs.gs.auth.service.account.json.keyfile"] = self.credentials_file
        return conf

    def env(self) -> dict[str, str]:
        """The settings as variables for a child process (the apply job's pyarrow)."""
        out = {
            "GOOGLE_CLOUD_PROJECT": self.project_id,
            "GOOGLE_APPLICATION_CREDENTIALS": self.credentials_file,
        }
        if self.endpoint and self.anonymous:
            out["STORAGE_EMULATOR_HOST"] = self.endpoint
        return {k: v for k, v in out.items() if v}

    @property
    def secrets(self) -> list[str]:
        """None: credentials are named by a file's path."""
        return []


_AZURE_SECRET = ("account_key", "sas_token", "client_secret")


@dataclass(frozen=True)
class AzureSettings:
    """Account, endpoint and credentials of Azure Blob Storage / ADLS Gen2 (all optional: the
    account may come from the URL, credentials from ``DefaultAzureCredential``: managed or
    workload identity, ``AZURE_CLIENT_ID`` ...)."""

    account_name: str | None = None
    #: the account's Blob endpoint, as a connection string's ``BlobEndpoint``: Azurite's
    #: ``http://127.0.0.1:10000/<account>``; None: ``https://<account>.blob.core.windows.net``
    endpoint: str | None = None
    client_id: str | None = None
    tenant_id: str | None = None
    account_key: str | None = field(default=None, repr=False)
    sas_token: str | None = field(default=None, repr=False)
    client_secret: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AzureSettings:
        """Read ``AZURE_STORAGE_CONNECTION_STRING`` (az CLI, adlfs), then the variables of
        obstore / adlfs (``AZURE_STORAGE_ACCOUNT_NAME``, ``AZURE_STORAGE_ACCOUNT_KEY``,
        ``AZURE_STORAGE_SAS_TOKEN``, ``AZURE_STORAGE_ENDPOINT``) and of the az CLI
        (``AZURE_STORAGE_ACCOUNT``, ``AZURE_STORAGE_KEY``)."""
        env = os.environ if env is None else env
        values = parse_connection_string(env.get("AZURE_STORAGE_CONNECTION_STRING") or "")
        for key, name in (
            ("AZURE_STORAGE_ACCOUNT_NAME", "account_name"),
            ("AZURE_STORAGE_ACCOUNT", "account_name"),
            ("AZURE_STORAGE_KEY", "account_key"),
            *((key, name) for name, key in AZURE_ENV.items()),
        ):
            if env.get(key) and name not in values:
                values[name] = env[key]
        return cls(**values)

    @classmethod
    def from_hadoop(cls, conf: Mapping[str, str], account: str | None = None) -> AzureSettings:
        """Read hadoop-azure's keys for ``account`` (``fs.azure.account.key.<account>.dfs.core.
        windows.net``, ``fs.azure.sas.fixed.token.<account>...``, ``fs.azure.account.oauth2.
        client.{id,secret,endpoint}[.<account>...]``); without ``account``, the one they name.

        :raises ConfigError: they name several accounts and ``account`` is None.
        """
        per: dict[str | None, dict[str, str]] = {}
        for key, value in _unprefixed(conf).items():
            if value and (m := AZURE_KEY.match(key)):
                name = AZURE_NAMES[m.group(1)]
                per.setdefault(m.group(2), {})[name] = (
                    azure_tenant(str(value)) if name == "tenant_id" else str(value)
                )
        named = sorted(a for a in per if a)
        if account is None and len(named) > 1:
            raise ConfigError(f"Hadoop's fs.azure.* keys name accounts {named}: say which one")
        account = account or (named[0] if named else None)
        return cls(account_name=account, **{**per.get(None, {}), **per.get(account, {})})

    def for_account(self, account: str) -> AzureSettings:
        """The settings for ``account``: these, or for another account only what is not bound
        to one (a service principal), endpoint and keys dropped."""
        if self.account_name in (None, account):
            return replace(self, account_name=account)
        return AzureSettings(
            account, client_id=self.client_id, tenant_id=self.tenant_id, client_secret=self.client_secret
        )

    def over(self, fallback: AzureSettings) -> AzureSettings:
        """These settings, with what they leave unset taken from ``fallback``."""
        mine = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        return replace(fallback, **mine)

    @property
    def blob_endpoint(self) -> str:
        return self.endpoint or f"https://{self.account_name}.blob.core.windows.net"

    def describe(self) -> str:
        """Where the store is, for messages: account and endpoint, never a credential."""
        return f"account {self.account_name!r} at {self.blob_endpoint}"

    def hadoop_conf(self) -> dict[str, str]:
        """Non-secret ``spark.hadoop.fs.azure.*`` settings for Spark's ABFS driver.  The account
        key or SAS token (``fs.azure.account.key.<account>.dfs.core.windows.net``) hadoop-azure
        reads only from its configuration: give it in a private properties file or a Hadoop
        credential provider, never on a command line."""
        suffix = f".{self.account_name}.dfs.core.windows.net"
        if self.account_key:
            return {f"spark.hadoop.fs.azure.account.auth.type{suffix}": "SharedKey"}
        if self.sas_token:
            return {f"spark.hadoop.fs.azure.account.auth.type{suffix}": "SAS"}
        if self.client_id and self.client_secret and self.tenant_id:
            return {
                f"spark.hadoop.fs.azure.account.auth.type{suffix}": "OAuth",
                f"spark.hadoop.fs.azure.account.oauth.provider.type{suffix}": (
                    "org.apache.hadoop.fs.azurebfs.oauth2.ClientCredsTokenProvider"
                ),
                f"spark.hadoop.fs.azure.account.oauth2.client.id{suffix}": self.client_id,
                f"spark.hadoop.fs.azure.account.oauth2.client.endpoint{suffix}": (
                    f"https://login.microsoftonline.com/{self.tenant_id}/oauth2/token"
                ),
            }
        return {}

    def env(self) -> dict[str, str]:
        """The settings as variables for a child process (the apply job's pyarrow)."""
        out = {"AZURE_STORAGE_ACCOUNT_NAME": self.account_name}
        out |= {key: getattr(self, name) for name, key in AZURE_ENV.items()}
        out |= {"AZURE_CLIENT_ID": self.client_id, "AZURE_TENANT_ID": self.tenant_id}
        out["AZURE_CLIENT_SECRET"] = self.client_secret
        return {k: v for k, v in out.items() if v}

    @property
    def secrets(self) -> list[str]:
        """The secret values (to mask in anything shown)."""
        return [v for v in (getattr(self, n) for n in _AZURE_SECRET) if v]


def parse_connection_string(text: str) -> dict[str, str]:
    """Settings from an Azure Storage connection string (``AccountName=...;AccountKey=...;
    BlobEndpoint=...;SharedAccessSignature=...``, or ``UseDevelopmentStorage=true``: Azurite's
    well-known account on ``127.0.0.1:10000``).

    :raises ConfigError: a part is not ``key=value`` (the message does not quote it).
    """
    parts: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(";"))):
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError("AZURE_STORAGE_CONNECTION_STRING: a part is not key=value")
        parts[key.strip().lower()] = value.strip()
    if parts.get("usedevelopmentstorage", "").lower() == "true":
        parts = {**_AZURITE, **parts}
    out = {"account_name": parts.get("accountname"), "account_key": parts.get("accountkey")}
    out["sas_token"] = parts.get("sharedaccesssignature")
    out["endpoint"] = parts.get("blobendpoint")
    if not out["endpoint"] and "endpointsuffix" in parts and out["account_name"]:
        scheme = parts.get("defaultendpointsprotocol", "https")
        out["endpoint"] = f"{scheme}://{out['account_name']}.blob.{parts['endpointsuffix']}"
    return {k: v for k, v in out.items() if v}


#: Azurite's development account (learn.microsoft.com/azure/storage/common/storage-use-azurite,
#: "Well-known storage account and key"): public, not a secret
_AZURITE = {
    "accountname": "devstoreaccount1",
    "accountkey": "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
    "blobendpoint": "http://127.0.0.1:10000/devstoreaccount1",
}


def _unprefixed(conf: Mapping[str, str]) -> dict[str, str]:
    return {k.removeprefix("spark.hadoop."): v for k, v in conf.items()}
