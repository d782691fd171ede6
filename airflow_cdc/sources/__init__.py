"""Built-in change sources.  Importing this package registers them with the source registry
(:mod:`airflow_cdc.core.source`); each source package defines its spec without importing its
implementation, so listing the sources stays cheap."""

from airflow_cdc.core.source import register_source
from airflow_cdc.sources import mysql, postgres, sqlserver, vitess

for _spec in (postgres.SOURCE, mysql.SOURCE, sqlserver.SOURCE, vitess.SOURCE):
    register_source(_spec)
