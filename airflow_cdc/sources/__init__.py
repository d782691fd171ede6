"""Built-in change sources.  Importing this package registers them with the source registry
(:mod:`airflow_cdc.core.source`); each source package defines its spec without importing its
implementation, so listing the sources stays cheap."""

from airflow_cdc.core.source import register_source
from airflow_cdc.sources import mysql, postgres, sqlserver, vitess

for _spec in (postgres.SOURCE, mysql.SOURCE, sqlserver.SOURCE, vitess.SOURCE):
    register_source(_spec)


def _register_retained() -> None:
    """Each source's retained-log reader (:mod:`airflow_cdc.core.retained`), imported on first use."""
    from importlib import import_module

    from airflow_cdc.core.retained import register_retained

    for kinds, module in (
        (("postgresql",), "postgres"),
        (("mysql", "mariadb"), "mysql"),
        (("sqlserver",), "sqlserver"),
        (("vitess",), "vitess"),
    ):
        register_retained(
            kinds, lambda *a, _m=module: import_module(f"airflow_cdc.sources.{_m}.retained").retained_log(*a)
        )


_register_retained()
