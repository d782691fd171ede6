"""Object-store credentials from an Airflow Connection (the ``airflow:`` option ``aws_conn_id``).

The core reads S3 settings from Hadoop keys and the process environment
(:class:`~airflow_cdc.core.storage.StorageSettings`); an Airflow deployment keeps them in a
Connection instead.  :func:`use_aws_connection` turns the Connection's fields into the ``AWS_*``
variables of the task process, so capture, commit, verify and the ``spark-submit`` or Spark Connect
client the apply task starts (its environment is inherited) all reach the same store, and registers
each secret with Airflow's masker first, so no task log, rendered field or XCom shows it.  A task
process runs one task: the variables end with it.
"""

from __future__ import annotations

import os

from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.storage import StorageSettings

#: setting -> the variable the libraries read (pyarrow, obstore, S3A's default provider chain)
_VARIABLES = {
    "endpoint": "AWS_ENDPOINT_URL",
    "region": "AWS_REGION",
    "access_key": "AWS_ACCESS_KEY_ID",
    "secret_key": "AWS_SECRET_ACCESS_KEY",
    "session_token": "AWS_SESSION_TOKEN",
}


def aws_settings(conn_id: str) -> StorageSettings:
    """The S3 settings of the Airflow ``aws`` Connection ``conn_id`` (login = access key id,
    password = secret key; extra ``endpoint_url``, ``region_name``, ``aws_session_token``).

    :raises ConfigError: no such Connection.
    """
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as e:  # noqa: BLE001 - Airflow raises its own not-found error
        raise ConfigError(
            f"aws_conn_id {conn_id!r}: no such Airflow Connection ({type(e).__name__})",
            hint=f"create an Amazon Web Services Connection named {conn_id!r}, or remove aws_conn_id",
        ) from e
    return StorageSettings.from_aws_connection(conn.login, conn.password, conn.extra_dejson)


def use_aws_connection(conn_id: str | None) -> StorageSettings | None:
    """Make the Connection ``conn_id`` this process's S3 endpoint and credentials (``AWS_*``);
    nothing without one.  Values the Connection leaves empty keep the environment's (or the
    instance role's, when there are none)."""
    if not conn_id:
        return None
    settings = aws_settings(conn_id)
    for secret in settings.secrets:
        mask_secret(secret)
    for name, variable in _VARIABLES.items():
        value = getattr(settings, name)
        if value:
            os.environ[variable] = str(value)
    if settings.endpoint:
        os.environ.pop("AWS_ENDPOINT_URL_S3", None)  # it would win over the Connection's endpoint
    return settings
