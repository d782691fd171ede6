"""Refuse to commit a batch that has not reached Delta (the offset never moves past unapplied data).

The apply job marks the last write of a batch on every Delta table it touches with the idempotent
transaction ``(airflow-cdc:<connector>:<batch id>, 1)``.  Commit reads those marks straight from each
table's ``_delta_log`` (:mod:`spark_jobs.cdc_apply.delta_log`: pyarrow only, no Spark) before it
moves the offset.  The check only reads; repeating it is free of side effects.

Which pipelines are checked is the property ``commit.require.applied``:

* ``auto`` (default): check whenever a Delta root is known (``delta.root``, or the target the
  commit step was given); a pipeline without one cannot apply and commits unchecked, with a warning.
* ``true``: always check; a missing Delta root is a configuration error.
* ``false``: a capture-only pipeline: never check (the batch is the product, not Delta).
"""

from __future__ import annotations

import logging
import re

from airflow_cdc.apply.submit import ApplyOptions
from airflow_cdc.core.batch import Batch
from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import BatchNotApplied, ConfigError
from spark_jobs.cdc_apply import delta_log
from spark_jobs.cdc_apply.layout import app_id, table_path

log = logging.getLogger(__name__)


def delta_target(config: ConnectorConfig, target: str | None = None) -> str | None:
    """The Delta root a commit must check, or ``None`` when the pipeline is capture-only.

    :param target: the Delta root the caller applies to (overrides ``delta.root``).
    :raises ConfigError: ``commit.require.applied=true`` without any Delta root.
    """
    policy = config["commit.require.applied"]
    if policy == "false":
        return None
    root = target or config["delta.root"]
    if root:
        return str(root)
    if policy == "true":
        raise ConfigError(
            "commit.require.applied=true but the pipeline names no Delta root: set delta.root, "
            "or set commit.require.applied=false if this pipeline only captures"
        )
    log.warning(
        "connector %s has no delta.root: committing without checking Delta "
        "(set commit.require.applied=false to declare a capture-only pipeline)",
        config["name"],
    )
    return None


def missing_tables(batch: Batch, target: str, bronze: bool, history: tuple[str, ...] = ()) -> list[str]:
    """Delta tables (``layer:table``) that lack this batch's idempotent-write mark.

    A batch without tables (no events, no snapshot rows) has nothing to miss.

    :param bronze: whether the apply writes the bronze change log (``delta.bronze.enabled``).
    :param history: regexes of the tables with SCD type 2 history (keyed tables only).
    """
    connector = batch.manifest["connector"]
    mark = app_id(connector, batch.batch_id)
    base = ("bronze", "silver") if bronze else ("silver",)
    missing = []
    for table in batch.tables():
        keyed = bool(batch.table_info(table).get("key_columns"))
        wanted = keyed and any(re.fullmatch(p, table, re.IGNORECASE) for p in history)
        layers = (*base, "history_log", "history") if wanted else base
        for layer in layers:
            if not delta_log.has_applied(table_path(target, layer, connector, table), mark):
                missing.append(f"{layer}:{table}")
    return missing


def ensure_applied(batch: Batch, config: ConnectorConfig, target: str | None = None) -> None:
    """Raise unless ``batch`` is applied to every Delta table it touches (see the module notes).

    :param target: the Delta root the caller applies to; default ``delta.root``.
    :raises BatchNotApplied: naming the tables without the batch's mark; nothing is committed.
    :raises ConfigError: see :func:`delta_target`.
    """
    root = delta_target(config, target)
    if root is None:
        return
    history = ApplyOptions.from_config(config).history_tables()
    missing = missing_tables(batch, root, config["delta.bronze.enabled"], history)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise BatchNotApplied(
            f"batch {batch.batch_id} is not applied to Delta at {root} ({shown}); the offset stays put",
            hint=f"run apply for batch {batch.batch_id} (idempotent), then commit it again",
        )
