"""Pipeline files as the Airflow provider reads them: Debezium properties plus an ``airflow:`` section.

The section holds what only the DAG needs (the core never sees it)::

    name: shop
    connector: postgresql
    table.include.list: public.customers,public.orders
    staging.path: ${env:AIRFLOW_CDC_DATA}/staging
    airflow:
      target: ${env:AIRFLOW_CDC_DATA}/delta     # Delta root; default: the delta.root property
      schedule: "*/5 * * * *"
      cdc_conn_id: cdc_postgres_default
      spark_conf: {spark.sql.shuffle.partitions: "4"}

Nothing here imports Airflow, so it is unit-testable and cheap at DAG-parse time.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_cdc.apply.submit import ApplyOptions
from airflow_cdc.core.config import COMMON_PROPERTIES, ConnectorConfig, split_list
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.pipeline import read_pipeline_file
from airflow_cdc.core.redact import SECRET_URL_PROPERTIES, secrets_in

SECTION = "airflow"

#: Options of the ``airflow:`` section with their defaults (``None``: decided by the caller).
OPTIONS: dict[str, Any] = {
    "dag_id": None,
    "schedule": None,
    "target": None,
    "cdc_conn_id": None,
    "spark_conn_id": "spark_default",
    # an Airflow aws Connection for s3:// staging and Delta (None: the environment / instance role)
    "aws_conn_id": None,
    "spark_conf": {},
    "delete_mode": None,
    "bronze": None,
    "tables": None,
    "sense": True,
    "check": None,  # the source's own default (PostgreSQL: slot)
    "deferrable": None,
    "poke_interval": 60,
    "sensor_timeout": 3600,
    "retries": 2,
    "retry_delay_seconds": 60,
    "apply": True,
    "verify": False,
    "tags": ["cdc"],
    # per step (sense, capture, apply, commit, verify): queue, pool, pool_slots, priority_weight,
    # executor, executor_config -- where a task runs under Celery / Kubernetes executors
    "task_options": {},
    # > 0: each run's snapshot chunks are read by up to this many mapped tasks (plan_snapshot ->
    # read_snapshot_part -> capture); 0: capture reads them itself
    "snapshot_tasks": 0,
}

_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
# "public.orders" or "public\.orders": a regex that can only match one table, usable as an Asset
_LITERAL_TABLE = re.compile(r"^([\w$]+)(?:\\?\.)([\w$]+)$")


@dataclass(frozen=True)
class PipelineSpec:
    """One pipeline: raw Debezium ``properties`` (``${env:...}`` left for the core to expand, so no
    secret value is copied around) and the ``airflow:`` ``options`` (environment expanded)."""

    properties: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    path: str | None = None

    @property
    def name(self) -> str:
        name = self.properties.get("name")
        if not name:
            raise ConfigError(f"pipeline {self.path or ''}: missing required property 'name'")
        return str(name)

    def option(self, key: str) -> Any:
        return self.options.get(key, OPTIONS[key])


def load_pipeline(pipeline: str | os.PathLike[str] | Mapping[str, Any]) -> PipelineSpec:
    """Read a pipeline file (YAML/JSON) or take a mapping; split off the ``airflow:`` section.

    :raises ConfigError: unreadable file, or an unknown option in the ``airflow:`` section.
    """
    if isinstance(pipeline, Mapping):
        raw, path = dict(pipeline), None
    else:
        raw, path = read_pipeline_file(str(pipeline)), str(pipeline)
    section = raw.pop(SECTION, None) or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"pipeline {path or ''}: the '{SECTION}' section must be a mapping")
    options = {}
    for key, value in section.items():
        if key not in OPTIONS:
            close = difflib.get_close_matches(str(key), list(OPTIONS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"pipeline {path or ''}: unknown option '{SECTION}.{key}'{hint}")
        options[key] = expand_env(value, f"{SECTION}.{key}")
    return PipelineSpec(raw, options, path)


def expand_env(value: Any, name: str) -> Any:
    """Replace ``${env:NAME}`` in strings (recursively in lists and mappings).

    :raises ConfigError: naming the option and the unset variable.
    """
    if isinstance(value, str):

        def repl(m: re.Match[str]) -> str:
            if m.group(1) not in os.environ:
                raise ConfigError(
                    f"option {name!r} refers to environment variable {m.group(1)!r}, which is not set"
                )
            return os.environ[m.group(1)]

        return _ENV_REF.sub(repl, value)
    if isinstance(value, list):
        return [expand_env(v, name) for v in value]
    if isinstance(value, Mapping):
        return {k: expand_env(v, f"{name}.{k}") for k, v in value.items()}
    return value


def delta_settings(spec: PipelineSpec) -> tuple[str | None, ApplyOptions]:
    """The Delta root and apply options: the ``airflow:`` options (``target``, ``delete_mode``,
    ``bronze``), else the ``delta.*`` properties, else their defaults."""
    props = spec.properties
    target = spec.option("target") or expand_env(props.get("delta.root"), "delta.root")
    values = {name: props.get(name) for name in ApplyOptions.PROPERTIES}  # None: the default
    for option, name in (("delete_mode", "delta.delete.mode"), ("bronze", "delta.bronze.enabled")):
        if spec.option(option) is not None:
            values[name] = spec.option(option)
    delta = ConnectorConfig([p for p in COMMON_PROPERTIES if p.name in ApplyOptions.PROPERTIES], values)
    return (str(target) if target else None), ApplyOptions.from_config(delta)


def literal_tables(spec: PipelineSpec) -> list[str]:
    """Tables known before the first run: ``airflow.tables``, else the literal (non-regex) entries of
    ``table.include.list`` (``public.orders`` or ``public\\.orders``).  Used for one Asset per table."""
    explicit = spec.option("tables")
    if explicit:
        return [str(t) for t in (split_list(explicit) if isinstance(explicit, str) else explicit)]
    out = []
    for entry in split_list(spec.properties.get("table.include.list") or ()):
        m = _LITERAL_TABLE.match(entry)
        if m:
            out.append(f"{m.group(1)}.{m.group(2)}")
    return out


def without_literal_secrets(properties: Mapping[str, Any]) -> dict[str, Any]:
    """Properties safe to store in Airflow's metadata DB (trigger kwargs): secret values that are not
    ``${env:...}`` references are dropped (the Connection or environment supplies them again)."""
    secret_names = ("password", "secret", "token")
    return {
        k: v
        for k, v in properties.items()
        if not (
            (any(s in k for s in secret_names) or (k in SECRET_URL_PROPERTIES and secrets_in({k: v})))
            and not (isinstance(v, str) and _ENV_REF.fullmatch(v))
        )
    }


def delta_location(target: str) -> Path | None:
    """The local directory of a Delta root given as a path or ``file://`` URL, else ``None``."""
    if target.startswith("file://"):
        return Path(target[len("file://") :])
    if "://" in target:
        return None
    return Path(target)
