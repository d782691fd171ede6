"""Provider metadata for Airflow's providers manager (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

_HOOKS = "airflow_cdc.airflow.hooks.cdc"


def _conn_type(
    conn_type: str, name: str, hook: str, port: int, extra_fields: dict[str, Any]
) -> dict[str, Any]:
    return {
        "connection-type": conn_type,
        "hook-class-name": f"{_HOOKS}.{hook}",
        "hook-name": name,
        "ui-field-behaviour": {
            "hidden-fields": [],
            "relabeling": {"schema": "Database", "login": "User"},
            "placeholders": {"port": str(port)},
        },
        "conn-fields": extra_fields,
    }


def _field(label: str, description: str, default: Any = None, kind: str = "string") -> dict[str, Any]:
    schema: dict[str, Any] = {"type": [kind, "null"]}
    if default is not None:
        schema["default"] = default
    return {"label": label, "description": description, "schema": schema}


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-cdc",
        "name": "Change data capture (airflow-cdc)",
        "description": "Debezium-grade change data capture into Delta Lake, without Kafka.",
        "versions": ["0.1.0"],
        "integrations": [{"integration-name": "airflow-cdc", "tags": ["software"]}],
        "operators": [
            {
                "integration-name": "airflow-cdc",
                "python-modules": [
                    "airflow_cdc.airflow.operators.capture",
                    "airflow_cdc.airflow.operators.apply",
                    "airflow_cdc.airflow.operators.commit",
                    "airflow_cdc.airflow.operators.verify",
                    "airflow_cdc.airflow.operators.snapshot_parts",
                ],
            }
        ],
        "sensors": [
            {"integration-name": "airflow-cdc", "python-modules": ["airflow_cdc.airflow.sensors.changes"]}
        ],
        "triggers": [
            {"integration-name": "airflow-cdc", "python-modules": ["airflow_cdc.airflow.triggers.changes"]}
        ],
        "hooks": [{"integration-name": "airflow-cdc", "python-modules": [_HOOKS]}],
        "extra-links": ["airflow_cdc.airflow.links.CdcBatchLink", "airflow_cdc.airflow.links.CdcDeltaLink"],
        "connection-types": [
            _conn_type(
                "cdcpostgres",
                "CDC source: PostgreSQL",
                "CdcHook",
                5432,
                {
                    "slot_name": _field(
                        "Replication slot", "slot.name (empty: the pipeline's, else Debezium's 'debezium')"
                    ),
                    "publication_name": _field(
                        "Publication",
                        "publication.name (empty: the pipeline's, else Debezium's 'dbz_publication')",
                    ),
                    "sslmode": _field("SSL mode", "database.sslmode (empty: the pipeline's, else 'prefer')"),
                },
            ),
            _conn_type(
                "cdcmysql",
                "CDC source: MySQL / MariaDB",
                "CdcMySqlHook",
                3306,
                {
                    "server_id": _field(
                        "Server id", "database.server.id (unique replica id)", kind="integer"
                    ),
                    "ssl_mode": _field("SSL mode", "database.ssl.mode"),
                },
            ),
            _conn_type(
                "cdcsqlserver",
                "CDC source: SQL Server",
                "CdcSqlServerHook",
                1433,
                {
                    "database_names": _field("Databases", "database.names (comma-separated)"),
                    "encrypt": _field("Encrypt", "database.encrypt (TLS)", True, kind="boolean"),
                    "trust_server_certificate": _field(
                        "Trust server certificate", "database.trustServerCertificate", False, kind="boolean"
                    ),
                    "application_intent": _field(
                        "Application intent", "database.applicationIntent (ReadWrite / ReadOnly)"
                    ),
                    "odbc_driver": _field("ODBC driver", "database.odbc.driver (FreeTDS by default)"),
                },
            ),
            _conn_type(
                "cdcvitess",
                "CDC source: Vitess",
                "CdcVitessHook",
                15991,
                {
                    "tablet_type": _field("Tablet type", "vitess.tablet.type (empty: MASTER)"),
                    "tls": _field("TLS", "vitess.grpc.tls", False, kind="boolean"),
                },
            ),
        ],
    }
