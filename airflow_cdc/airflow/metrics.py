"""Export the connector metrics through Airflow's own metrics backend.

Airflow's ``[metrics]`` section decides where they go -- StatsD (``statsd_on``, tags with
``statsd_influxdb_enabled`` or ``statsd_datadog_enabled``), OpenTelemetry (``otel_on``: OTLP/HTTP to
``otel_host:otel_port``), or nowhere -- exactly as for Airflow's own metrics, with its prefix
(``statsd_prefix`` / ``otel_prefix``) and allow/block lists.  Names and tags:
:mod:`airflow_cdc.core.metrics`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from airflow_cdc.core.metrics import MetricsRecorder, export

log = logging.getLogger(__name__)


def _stats() -> Any:
    """Airflow's metrics module, its backend set up from ``[metrics]`` if this process has not
    done so yet (a task process has; ``airflow dags test`` and plain Python have not)."""
    from airflow.sdk._shared.observability.metrics import stats as shared
    from airflow.sdk.configuration import conf
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    if getattr(shared, "_factory", None) is None:
        stats.initialize(
            factory=stats_utils.get_stats_factory(),
            export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=True),
        )
    return stats


class AirflowStatsSink:
    """A :class:`~airflow_cdc.core.metrics.MetricsSink` writing to Airflow's metrics backend."""

    def __init__(self) -> None:
        self.stats = _stats()

    def gauge(self, name: str, value: float, tags: dict[str, str]) -> None:
        self.stats.gauge(name, value, tags=tags)

    def timing(self, name: str, ms: float, tags: dict[str, str]) -> None:
        self.stats.timing(name, ms, tags=tags)

    def flush(self) -> None:
        """Push OpenTelemetry's buffered points now (a task process may end before its next export)."""
        from airflow.sdk.configuration import conf

        if not conf.getboolean("metrics", "otel_on", fallback=False):
            return
        from opentelemetry import metrics

        flush = getattr(metrics.get_meter_provider(), "force_flush", None)
        if flush is not None:
            flush(timeout_millis=5_000)


def record_and_export(record: Callable[[], MetricsRecorder]) -> None:
    """Compute a step's metrics and export them; a failure is logged, never raised."""
    try:
        recorder = record()
    except Exception as e:  # noqa: BLE001 - metrics must never fail a task
        log.warning("metrics not recorded: %s", e)
        return
    export_metrics(recorder)


def export_metrics(recorder: MetricsRecorder | None) -> int:
    """Send a step's metrics to Airflow's backend; returns how many points.  Never raises."""
    if recorder is None:
        return 0
    try:
        sink = AirflowStatsSink()
        sent = export(recorder, sink)
        sink.flush()
    except Exception as e:  # noqa: BLE001 - metrics must never fail a task
        log.warning("metrics not exported: %s", e)
        return 0
    return sent
