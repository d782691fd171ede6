"""Sensor: wait until the source has something to capture, without holding a worker slot."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSensorTimeout,
    AirflowSkipException,
)

from airflow_cdc.airflow.errors import airflow_errors
from airflow_cdc.airflow.hooks.cdc import CdcHook
from airflow_cdc.airflow.pipeline import without_literal_secrets
from airflow_cdc.airflow.signals import signals_from_run
from airflow_cdc.airflow.triggerer_health import triggerer_status
from airflow_cdc.airflow.triggers.changes import CdcChangesTrigger
from airflow_cdc.core.errors import RetainedLogExceeded


class CdcChangesSensor(BaseSensorOperator):
    """Succeed once there is work for capture: no committed offset yet, snapshot chunks pending, an
    ad hoc snapshot requested by the run, or the source moved past the committed offset (cheap
    check; PostgreSQL's default ``slot`` check fires only for published changes, ``wal`` may
    over-report, which costs an empty batch).

    Deferrable by default where a triggerer runs: ``execute`` checks once, then defers to
    :class:`CdcChangesTrigger`, which polls asynchronously in the triggerer.  Without an explicit
    ``deferrable`` (and with ``[operators] default_deferrable`` off), the API server's health
    endpoint decides: a healthy triggerer -> defer; none (or no answer) -> poke from the worker,
    with a warning saying why.

    Each check also measures the log the source keeps for the connector (exported as
    ``airflow_cdc.source.*`` metrics) and fails the task, not retried, once it passes
    ``retained.log.max.fraction`` of the server's limit or ``retained.log.max.bytes`` /
    ``retained.log.max.age.ms``: before the server drops the committed position or fills its disk.

    :param pipeline: pipeline file path or mapping of Debezium properties. (templated)
    :param cdc_conn_id: Airflow Connection of the source database. (templated)
    :param check: ``None``: the source's default.  PostgreSQL: ``slot`` (default) or ``wal`` (see
        ``PostgresSource.changes_after``); MySQL: ``wal``/``binlog`` or ``gtid`` (see
        ``MySqlSource.changes_after``).
    :param deferrable: True: wait in the triggerer; False: poke from the worker (``mode``);
        None (default): ``[operators] default_deferrable`` if set, else defer when the API server
        reports a healthy triggerer.
    :param partition: the partition of a partitioned connector to watch (a SQL Server database, a
        Vitess task); ``None`` for an unpartitioned one. (templated)
    """

    template_fields: Sequence[str] = ("pipeline", "cdc_conn_id", "partition")
    ui_color = "#fcf3cf"

    def __init__(
        self,
        *,
        pipeline: str | Mapping[str, Any],
        cdc_conn_id: str | None = None,
        check: str | None = None,
        deferrable: bool | None = None,
        partition: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.partition = partition
        self.pipeline = pipeline
        self.cdc_conn_id = cdc_conn_id
        self.check = check
        self.deferrable = deferrable

    def _due(self, context: Context) -> tuple[bool, dict[str, Any] | None]:
        """(work is due now, committed offset)."""
        dag_run = context.get("dag_run")
        if signals_from_run(getattr(dag_run, "conf", None), context.get("params")):
            self.log.info("ad hoc snapshot requested by the run")
            return True, None
        hook = CdcHook(pipeline=self.pipeline, cdc_conn_id=self.cdc_conn_id)
        config = hook.get_partition(self.partition)
        stored = hook.get_store(config).load(config.state_name)
        if stored is None:
            self.log.info("no committed offset yet: the initial run is due")
            return True, None
        hook.check_retained(self.partition)  # the guard: fails before the source drops the position
        if (stored.data.get("snapshot") or {}).get("pending"):
            self.log.info("snapshot chunks are pending")
            return True, stored.data.get("offset")
        offset = stored.data.get("offset")
        due = hook.changes_after(offset, self.check, self.partition)
        self.log.info(
            "%s past the committed offset %s (check %s; state version %s, last batch %s)",
            "changes" if due else "no change",
            offset,
            self.check or "default",
            stored.version,
            stored.data.get("last_batch"),
        )
        return due, offset

    def poke(self, context: Context) -> bool:
        with airflow_errors("sense"):
            return self._due(context)[0]

    def _defers(self) -> bool:
        """Whether to defer (see the class docstring); logs the reason when it decides itself."""
        if self.deferrable is not None:
            return bool(self.deferrable)
        if conf.getboolean("operators", "default_deferrable", fallback=False):
            return True
        healthy, why = triggerer_status()
        if healthy:
            self.log.info("deferring to the triggerer: %s", why)
        else:
            self.log.warning(
                "not deferring: %s; poking from a worker instead (mode=%s, every %ss; pass "
                "deferrable=True or False, or set the pipeline's `deferrable` option, to choose)",
                why, self.mode, self.poke_interval,
            )  # fmt: skip
        return healthy

    def execute(self, context: Context) -> Any:
        if not self._defers():
            return super().execute(context)
        with airflow_errors("sense"):
            due, offset = self._due(context)
        if due or offset is None:
            return None
        pipeline = self.pipeline if isinstance(self.pipeline, str) else without_literal_secrets(self.pipeline)
        self.defer(
            trigger=CdcChangesTrigger(
                pipeline=pipeline,
                offset=offset,
                cdc_conn_id=self.cdc_conn_id,
                check=self.check,
                poll_interval=self.poke_interval,
                partition=self.partition,
                timeout_at=time.time() + self.timeout,
            ),
            method_name="execute_complete",
            # the trigger ends the wait itself at the sensor's timeout; this is a safety net only
            timeout=timedelta(seconds=self.timeout + 2 * self.poke_interval + 60),
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> None:
        if event and event.get("status") == "timeout":
            message = (
                f"no change past offset {event.get('offset')} within {self.timeout:.0f}s "
                f"({event.get('polls')} checks)"
            )
            self.log.info("%s: %s", message, "skipping this run" if self.soft_fail else "timing out")
            if self.soft_fail:
                raise AirflowSkipException(message)
            raise AirflowSensorTimeout(message)
        if event and event.get("status") == "error" and event.get("error") == RetainedLogExceeded.__name__:
            raise AirflowFailException(
                f"sense failed (not retried: a person must act first): {event['message']}"
            )
        if not event or event.get("status") != "changes":
            raise AirflowException(f"waiting for changes failed: {(event or {}).get('message', event)}")
        self.log.info(
            "source moved past offset %s (after %s checks)", event.get("offset"), event.get("polls")
        )
