"""Issue 38: the operators' metrics reach Airflow's own metrics backend, as Airflow's ``[metrics]``
configures it -- StatsD (a UDP listener on loopback reads the datagrams) and OpenTelemetry (a tiny
OTLP/HTTP receiver on loopback decodes the protobuf requests with ``opentelemetry-proto``)."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

from airflow_cdc.airflow.operators.capture import CdcCaptureOperator
from airflow_cdc.airflow.operators.commit import CdcCommitOperator
from airflow_cdc.airflow.sensors.changes import CdcChangesSensor
from tests.airflow.support import direct_props, load_shop

CTX = {"dag_run": type("Run", (), {"conf": {}})(), "params": {}}


def _use_metrics(monkeypatch: pytest.MonkeyPatch, **settings: Any) -> None:
    """Configure Airflow's ``[metrics]`` through its environment variables and rebuild the backend."""
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    for key, value in settings.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key.upper()}", str(value))
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)


@pytest.fixture
def no_metrics_after() -> Iterator[None]:
    yield
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk.observability import stats

    stats.initialize(factory=NoStatsLogger, export_legacy_names=False)


def _run_pipeline(pg_db: Any, tmp_path: Any) -> dict[str, Any]:
    """Capture (the snapshot), commit, a known change, capture and commit, one sensor check."""
    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging", **{"custom.metric.tags": "env=test"})
    for _ in range(2):
        out = CdcCaptureOperator(task_id="capture", pipeline=props).execute(CTX)
        try:
            CdcCommitOperator(task_id="commit", pipeline=props, batch_path=out["batch_path"]).execute({})
        except Exception as e:  # an empty batch is committed, then skipped (no Asset event)
            assert "no events" in str(e)
        with pg_db.connect(autocommit=True) as conn:
            conn.execute("UPDATE public.orders SET note = 'x' WHERE id <= 3")
    CdcChangesSensor(task_id="sense", pipeline=props, deferrable=False).poke(CTX)
    return props


def test_statsd_datagrams_carry_debezium_names_and_tags(pg_db, tmp_path, monkeypatch, no_metrics_after):
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(0.5)
    _use_metrics(
        monkeypatch,
        statsd_on=True,
        statsd_host="127.0.0.1",
        statsd_port=listener.getsockname()[1],
        statsd_prefix="airflow",
        statsd_influxdb_enabled=True,
    )
    props = _run_pipeline(pg_db, tmp_path)
    lines = []
    try:
        while True:
            lines += listener.recv(65535).decode().splitlines()
    except TimeoutError:
        pass
    finally:
        listener.close()
    gauges: dict[tuple[str, frozenset], list[float]] = {}  # every value sent, in order
    for line in lines:
        name_tags, _, rest = line.partition(":")
        value, _, kind = rest.partition("|")
        name, *tags = name_tags.split(",")
        if kind == "g":
            gauges.setdefault((name, frozenset(tags)), []).append(float(value))
    base = {f"connector={props['name']}", f"server={props['name']}", "env=test"}
    snapshot = gauges[
        ("airflow.airflow_cdc.snapshot.TotalNumberOfEventsSeen", frozenset(base | {"context=snapshot"}))
    ]
    assert snapshot == [450, 0]  # the shop schema's 50 customers and 400 orders, then none
    key = (
        "airflow.airflow_cdc.streaming.TotalNumberOfUpdateEventsSeen",
        frozenset(base | {"context=streaming"}),
    )
    assert gauges[key] == [0, 3]
    per_table = base | {"context=streaming", "table=public.orders"}
    assert gauges[("airflow.airflow_cdc.streaming.TotalNumberOfEventsSeen", frozenset(per_table))] == [3]
    source = base | {"context=source"}
    assert gauges[("airflow.airflow_cdc.source.RetainedLogGuardTripped", frozenset(source))] == [0, 0, 0]
    assert ("airflow.airflow_cdc.source.BehindBytes", frozenset(base | {"context=source"})) in gauges
    assert any(
        line.startswith("airflow.airflow_cdc.commit.DurationMs") and line.endswith("|ms") for line in lines
    )


class _Receiver(http.server.BaseHTTPRequestHandler):
    requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = metrics_service_pb2.ExportMetricsServiceRequest()
        request.ParseFromString(body)
        type(self).requests.append(request)
        reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


def test_opentelemetry_collector_receives_the_gauges(pg_db, tmp_path, monkeypatch, no_metrics_after):
    """OpenTelemetry instrument names are case-insensitive: the SDK sends them in lower case."""
    _Receiver.requests = []
    # the receiver outlives the test: Airflow's OpenTelemetry backend flushes once more at exit
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _use_metrics(
        monkeypatch,
        otel_on=True,
        otel_host="127.0.0.1",
        otel_port=server.server_address[1],
        otel_ssl_active=False,
    )
    props = _run_pipeline(pg_db, tmp_path)  # each operator flushes what it recorded
    points: dict[str, list[tuple[dict[str, str], float]]] = {}
    for request in _Receiver.requests:
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.HasField("gauge"):
                        for p in metric.gauge.data_points:
                            attrs = {a.key: a.value.string_value for a in p.attributes}
                            value = p.as_double if p.HasField("as_double") else p.as_int
                            points.setdefault(metric.name, []).append((attrs, value))
    remaining = points["airflow.airflow_cdc.snapshot.remainingtablecount"]
    attrs = {"connector": props["name"], "server": props["name"], "context": "snapshot", "env": "test"}
    assert (attrs, 0) in remaining
    updates = points["airflow.airflow_cdc.streaming.totalnumberofupdateeventsseen"]
    assert ({**attrs, "context": "streaming"}, 3) in updates
    assert any(a.get("context") == "source" for a, _ in points["airflow.airflow_cdc.source.positionagems"])
    assert "airflow.airflow_cdc.silver.lagms" in points


def test_guard_fails_the_sensor_poking_and_deferred(pg_db, tmp_path):
    """The slot held behind while writes continue: the poke and the trigger both fail the task,
    not retried, naming the connector, the slot and the limit."""
    import asyncio

    from airflow.sdk.exceptions import AirflowFailException

    from airflow_cdc.airflow.triggers.changes import CdcChangesTrigger

    load_shop(pg_db)
    props = direct_props(pg_db, tmp_path / "staging", **{"retained.log.max.bytes": 1_500_000})
    out = CdcCaptureOperator(task_id="capture", pipeline=props).execute(CTX)
    CdcCommitOperator(task_id="commit", pipeline=props, batch_path=out["batch_path"]).execute({})
    sensor = CdcChangesSensor(task_id="sense", pipeline=props, deferrable=False)
    assert sensor.poke(CTX) is False  # within the limit, nothing new
    with pg_db.connect(autocommit=True) as conn:
        conn.execute("CREATE TABLE filler AS SELECT g, md5(g::text) AS h FROM generate_series(1, 40000) g")
    with pytest.raises(AirflowFailException, match=r"not retried: a person must act first.*over the limit"):
        sensor.poke(CTX)

    trigger = CdcChangesTrigger(pipeline=props, offset={"lsn": "0/0"}, poll_interval=0.1)

    async def first_event() -> dict[str, Any]:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("no event")

    event = asyncio.run(first_event())
    assert event["status"] == "error" and event["error"] == "RetainedLogExceeded"
    assert props["slot.name"] in event["message"] and "retained.log.max.bytes=1500000" in event["message"]
    with pytest.raises(AirflowFailException, match="not retried"):
        sensor.execute_complete(CTX, event)
