"""Catalog names for the Delta tables the job writes (``delta.catalog``).

The tables stay where they are (``<root>/<layer>/<connector>/<table>``, the layout every other
part reads); the catalog gets an external table over each location, so users query
``catalog.schema.silver_public_orders`` in Spark SQL, Databricks (Unity Catalog external
locations) or any engine sharing the metastore (Hive, Glue).  Registration is
``CREATE SCHEMA IF NOT EXISTS`` + ``CREATE TABLE IF NOT EXISTS <name> USING delta LOCATION``:
idempotent, and a name already registered elsewhere is refused, never repointed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import SparkSession

from .deltasql import string_literal
from .frames import quoted

log = logging.getLogger("airflow_cdc.apply")

#: the default name of a registered table: its layer and the source table (dots as underscores)
DEFAULT_FORMAT = "{layer}_{table}"


class CatalogError(RuntimeError):
    """A catalog name is taken by a table at another location (nothing was registered)."""


@dataclass(frozen=True)
class CatalogNames:
    """``namespace`` (``catalog.schema`` or ``schema``) and the name template (fields ``layer``,
    ``table`` (``public_orders``), ``schema``, ``name`` (the source table's own name), ``connector``)."""

    namespace: str
    table_format: str = DEFAULT_FORMAT

    def name(self, layer: str, connector: str, table: str) -> str:
        schema, _, own = table.rpartition(".")
        text = self.table_format.format(
            layer=layer, table=table.replace(".", "_"), schema=schema, name=own, connector=connector
        )
        return ".".join(quoted(part) for part in [*self.namespace.split("."), text])

    def register(self, spark: SparkSession, layer: str, connector: str, table: str, path: str) -> str:
        """Register the Delta table at ``path`` (it exists) under its name; returns the name.

        :raises CatalogError: the name is registered with another location.
        """
        name = self.name(layer, connector, table)
        namespace = ".".join(quoted(p) for p in self.namespace.split("."))
        if not spark.catalog.tableExists(name):
            spark.sql(f"CREATE SCHEMA IF NOT EXISTS {namespace}").collect()
            spark.sql(
                f"CREATE TABLE IF NOT EXISTS {name} USING delta LOCATION {string_literal(path)}"
            ).collect()
            log.info("registered %s -> %s", name, path)
        where = spark.sql(f"DESCRIBE DETAIL {name}").first()
        if where is not None and _same_place(str(where["location"]), path):
            return name
        raise CatalogError(
            f"catalog table {name} is registered at {where['location'] if where else '?'}, not at {path}: "
            "choose another delta.catalog (or delta.catalog.table.format), or drop that table"
        )


def _same_place(registered: str, path: str) -> bool:
    def norm(p: str) -> str:
        p = p.removeprefix("file:").rstrip("/")
        return "s3a://" + p[len("s3://") :] if p.startswith("s3://") else p

    return norm(registered) == norm(path)
