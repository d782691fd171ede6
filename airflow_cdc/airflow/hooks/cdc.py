"""Hooks: build a connector's configuration, capture runner and cheap change checks from an Airflow
Connection plus a pipeline file.

The Connection supplies where and who (host, port, login, password, schema = database) and may
carry further Debezium properties in its extra (``{"slot.name": "shop_cdc"}``; the form fields
``slot_name``, ``publication_name``, ``sslmode`` map onto ``slot.name``, ``publication.name``,
``database.sslmode``).  Properties in the pipeline file override the Connection.  The password
only ever lives in a :class:`~airflow_cdc.core.config.Secret`: it is never logged.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

import airflow_cdc.airflow.state_variable  # noqa: F401  (registers the airflow-variable:// store)
from airflow_cdc.airflow.pipeline import PipelineSpec, load_pipeline
from airflow_cdc.airflow.storage import use_aws_connection
from airflow_cdc.core.capture import Capture
from airflow_cdc.core.config import ConnectorConfig, Secret
from airflow_cdc.core.errors import CdcError, RetainedLogExceeded
from airflow_cdc.core.pipeline import (
    build_capture,
    build_config,
    build_source,
    build_store,
    partition_config,
)
from airflow_cdc.core.redact import secrets_in
from airflow_cdc.core.source import check_connection
from airflow_cdc.core.state import StateStore

#: Connection form fields (extra) -> Debezium property, per source kind.
FORM_PROPERTIES = {
    "slot_name": "slot.name",
    "publication_name": "publication.name",
    "sslmode": "database.sslmode",
    "ssl_mode": "database.ssl.mode",
    "server_id": "database.server.id",
    "database_names": "database.names",
    "encrypt": "database.encrypt",
    "trust_server_certificate": "database.trustServerCertificate",
    "application_intent": "database.applicationIntent",
    "odbc_driver": "database.odbc.driver",
    "tablet_type": "vitess.tablet.type",
    "tls": "vitess.grpc.tls",
}
#: Where the Connection's *schema* field (the database) goes, per source kind.
DATABASE_PROPERTY = {
    "postgresql": "database.dbname",
    "mysql": "database.include.list",
    "mariadb": "database.include.list",
    "sqlserver": "database.names",
    "vitess": "vitess.keyspace",
}


def connection_properties(conn: Any, connector: str) -> dict[str, Any]:
    """Debezium properties from an Airflow Connection (fields and extra); empty values are skipped."""
    props: dict[str, Any] = {"connector": connector}
    database = DATABASE_PROPERTY.get(connector.lower(), "database.dbname")
    for prop, value in (
        ("database.hostname", conn.host),
        ("database.port", conn.port),
        ("database.user", conn.login),
        (database, conn.schema),
    ):
        if value not in (None, ""):
            props[prop] = value
    if conn.password:
        props["database.password"] = Secret(conn.password)
    for key, value in (conn.extra_dejson or {}).items():
        if value in (None, ""):
            continue
        props[FORM_PROPERTIES.get(key, key)] = value
    return props


#: connector per Connection type; the ``cdc_*`` names of earlier releases keep working (Airflow
#: logs an RFC 3986 warning for a type with ``_`` each time it reads such a Connection)
_CONNECTORS = {
    "cdcmysql": "mysql",
    "cdcsqlserver": "sqlserver",
    "cdcvitess": "vitess",
    "cdc_mysql": "mysql",
    "cdc_sqlserver": "sqlserver",
}


class CdcHook(BaseHook):
    """Interact with a CDC source described by a pipeline file and (optionally) an Airflow Connection.

    :param pipeline: pipeline file path or mapping of Debezium properties (``airflow:`` section allowed).
    :param cdc_conn_id: Connection with host, port, credentials, database and extra properties;
        ``None`` when the pipeline file holds everything (e.g. ``${env:...}`` references).
    """

    conn_name_attr = "cdc_conn_id"
    default_conn_name = "cdc_postgres_default"
    conn_type = "cdcpostgres"
    hook_name = "CDC source: PostgreSQL"
    connector = "postgresql"

    def __init__(
        self, *, pipeline: str | Mapping[str, Any] | None = None, cdc_conn_id: str | None = None
    ) -> None:
        """:param pipeline: ``None`` only to reach the Connection's server alone (the connection
        form's *Test* button: :meth:`test_connection`)."""
        super().__init__()
        self.pipeline = pipeline
        self.cdc_conn_id = cdc_conn_id
        self._spec: PipelineSpec | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database", "login": "User"},
            "placeholders": {
                "host": "db.example.com",
                "port": "5432",
                "schema": "shop",
                "extra": '{"slot.name": "shop_cdc", "publication.name": "shop_pub"}',
            },
        }

    @property
    def spec(self) -> PipelineSpec:
        if self._spec is None:
            if self.pipeline is None:  # the Connection alone: enough to reach and check the server
                scratch = os.path.join(tempfile.gettempdir(), "airflow-cdc-test-connection")
                name = f"test-{self.cdc_conn_id}"
                props = {"connector": self.connector, "name": name, "staging.path": scratch}
                self._spec = PipelineSpec(props)
            else:
                self._spec = load_pipeline(self.pipeline)
        return self._spec

    def test_connection(self) -> tuple[bool, str]:
        """Reach the server of the Connection and check what capture needs there (server settings,
        privileges, CDC enabled ...), changing nothing.  The Airflow connection form's *Test*.

        :returns: ``(True, what was checked)`` or ``(False, what is missing and how to fix it)``.
        """
        try:
            return True, check_connection(self.get_conn())
        except CdcError as e:
            return False, str(e)
        except Exception as e:  # noqa: BLE001 - reported on the form, never raised there
            return False, f"{type(e).__name__}: {e}"

    def properties(self) -> dict[str, Any]:
        """Connection properties overlaid with the pipeline's (the pipeline wins).  With the
        ``airflow:`` option ``aws_conn_id``, that Connection also becomes this task process's
        object-store credentials (:func:`~airflow_cdc.airflow.storage.use_aws_connection`)."""
        conn = self.get_connection(self.cdc_conn_id) if self.cdc_conn_id else None
        use_aws_connection(self.spec.option("aws_conn_id"))
        return self._merge(self.spec, conn)

    async def aproperties(self) -> dict[str, Any]:
        """:meth:`properties` for async callers: the Connection through Airflow's async lookup, the
        pipeline file read in a worker thread."""
        spec = await asyncio.to_thread(lambda: self.spec)
        conn = await self.aget_connection(self.cdc_conn_id) if self.cdc_conn_id else None
        return self._merge(spec, conn)

    def _merge(self, spec: PipelineSpec, conn: Any) -> dict[str, Any]:
        props: dict[str, Any] = {}
        if conn is not None:
            kind = spec.properties.get("connector") or spec.properties.get("connector.class")
            props.update(connection_properties(conn, str(kind or self._connector_for(conn.conn_type))))
        props.update(spec.properties)
        # the masker redacts these from task logs, rendered fields and XCom (state.store may be a
        # URL with a password that no property kind could have hidden before this point)
        for secret in secrets_in(props):
            mask_secret(secret)
        return props

    @staticmethod
    def _connector_for(conn_type: str | None) -> str:
        return _CONNECTORS.get(conn_type or "", "postgresql")

    def get_conn(self) -> ConnectorConfig:
        """The validated connector configuration."""
        return build_config(self.properties())

    def get_store(self, config: ConnectorConfig | None = None) -> StateStore:
        return build_store(config or self.get_conn())

    def get_capture(self, config: ConnectorConfig | None = None, partition: str | None = None) -> Capture:
        """The capture runner (of ``partition`` for a partitioned connector).

        :raises ConfigError: no such partition, or none named for a partitioned connector.
        """
        return build_capture(config or self.get_conn(), partition)

    def get_partition(self, partition: str | None) -> ConnectorConfig:
        """The config of one partition (``None``: the unpartitioned connector)."""
        return partition_config(self.get_conn(), partition)

    def changes_after(
        self, offset: dict[str, Any] | None, check: str | None = None, partition: str | None = None
    ) -> bool:
        """Whether the source may hold changes past ``offset`` (cheap; see the source's docs)."""
        return _source_changes_after(build_source(self.get_partition(partition)), offset, check)

    async def apartition(self, partition: str | None = None) -> ConnectorConfig:
        """:meth:`get_partition` for async callers: the properties read once, so a trigger's poll
        hands the same config to the guard and the change check."""
        return partition_config(build_config(await self.aproperties()), partition)

    async def achanges_after(
        self,
        offset: dict[str, Any] | None,
        check: str | None = None,
        partition: str | None = None,
        config: ConnectorConfig | None = None,
    ) -> bool:
        """:meth:`changes_after` without blocking the event loop: PostgreSQL through psycopg's
        ``AsyncConnection``; other sources through a worker thread.  ``config``: the partition's
        config from :meth:`apartition` (read here when not given)."""
        config = config or await self.apartition(partition)
        if config["connector"] != "postgresql":
            source = build_source(config)
            return await asyncio.to_thread(_source_changes_after, source, offset, check)
        if offset is None:
            return True
        from airflow_cdc.airflow.hooks.pg_async import pg_changes_after

        return await pg_changes_after(config, offset, check)

    def check_retained(self, partition: str | None = None) -> None:
        """Measure the log the source keeps for the connector, export it (Airflow metrics, the
        ``sensor`` section of ``status``) and apply the guard (``retained.log.max.*``).

        :raises RetainedLogExceeded: the server is about to drop the position or fill its disk.
        """
        _check_retained(self.get_partition(partition))

    async def acheck_retained(
        self, partition: str | None = None, config: ConnectorConfig | None = None
    ) -> None:
        """:meth:`check_retained` without blocking the event loop (the queries run in a thread).
        ``config`` as for :meth:`achanges_after`."""
        config = config or await self.apartition(partition)
        await asyncio.to_thread(_check_retained, config)


def _source_changes_after(source: Any, offset: dict[str, Any] | None, check: str | None) -> bool:
    return bool(source.changes_after(offset, check))


def _check_retained(config: ConnectorConfig) -> None:
    from airflow_cdc.airflow.metrics import export_metrics
    from airflow_cdc.core.health import source_check

    stored = build_store(config).load(config.state_name)
    if stored is None:  # nothing committed: nothing held yet
        return
    recorder, verdict = source_check(config, dict(stored.data))
    export_metrics(recorder)
    if verdict.tripped:
        raise RetainedLogExceeded(verdict.message)


class CdcMySqlHook(CdcHook):
    """:class:`CdcHook` for MySQL / MariaDB sources (binlog)."""

    default_conn_name = "cdc_mysql_default"
    conn_type = "cdcmysql"
    hook_name = "CDC source: MySQL / MariaDB"
    connector = "mysql"


class CdcSqlServerHook(CdcHook):
    """:class:`CdcHook` for SQL Server sources (CDC change tables)."""

    default_conn_name = "cdc_sqlserver_default"
    conn_type = "cdcsqlserver"
    hook_name = "CDC source: SQL Server"
    connector = "sqlserver"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database", "login": "User"},
            "placeholders": {
                "host": "sqlserver.example.com",
                "port": "1433",
                "schema": "shop",
                "extra": '{"database_names": "shop", "encrypt": true, "trust_server_certificate": false}',
            },
        }


class CdcVitessHook(CdcHook):
    """:class:`CdcHook` for Vitess keyspaces (vtgate's gRPC VStream)."""

    default_conn_name = "cdc_vitess_default"
    conn_type = "cdcvitess"
    hook_name = "CDC source: Vitess"
    connector = "vitess"

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": [],
            "relabeling": {
                "host": "vtgate host",
                "port": "vtgate gRPC port",
                "schema": "Keyspace",
                "login": "User",
            },  # fmt: skip
            "placeholders": {
                "host": "vtgate.example.com",
                "port": "15991",
                "schema": "commerce",
                "extra": '{"tablet_type": "MASTER", "tls": false}',
            },
        }
