"""Where an object store's endpoint and credentials come from, and how they reach Spark.

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

from spark_jobs.cdc_apply.delta_log import S3A_KEYS

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
