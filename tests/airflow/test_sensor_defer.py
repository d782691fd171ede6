"""The sensor defers by default only where a triggerer runs: the API server's health endpoint
(served here by a local HTTP server with Airflow's response shape) decides."""

from __future__ import annotations

import importlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_cdc.airflow.sensors.changes import CdcChangesSensor
from airflow_cdc.airflow.triggerer_health import HEALTH_PATH, api_base_url, triggerer_status
from airflow_cdc.testing.servers import free_port

OFFSET = {"lsn": "0/16B3748"}


def health(triggerer_status: str | None) -> dict:
    return {
        "metadatabase": {"status": "healthy"},
        "scheduler": {"status": "healthy", "latest_scheduler_heartbeat": "2026-11-25T06:00:00+00:00"},
        "triggerer": {"status": triggerer_status, "latest_triggerer_heartbeat": "2026-11-25T06:00:01+00:00"},
        "dag_processor": None,
    }


@pytest.fixture
def api_server(monkeypatch):
    """An HTTP server answering ``/api/v2/monitor/health`` with ``state["body"]``; [api] base_url
    points at it."""
    state: dict = {"body": health("healthy"), "paths": []}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            state["paths"].append(self.path)
            body = json.dumps(state["body"]).encode()
            self.send_response(200 if self.path == HEALTH_PATH else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", f"http://127.0.0.1:{server.server_port}/")
    yield state
    server.shutdown()
    server.server_close()


def sensor(monkeypatch, **kwargs) -> CdcChangesSensor:
    s = CdcChangesSensor(task_id="sense", pipeline={"name": "p"}, timeout=1, poke_interval=0.1, **kwargs)
    monkeypatch.setattr(s, "_due", lambda context: (False, OFFSET))  # nothing to capture yet
    return s


def test_healthy_triggerer_defers_by_default(api_server, monkeypatch, capsys):
    with pytest.raises(TaskDeferred) as deferred:
        sensor(monkeypatch).execute({})
    assert deferred.value.trigger.serialize()[1]["offset"] == OFFSET
    assert api_server["paths"] == [HEALTH_PATH]
    assert "deferring to the triggerer: triggerer healthy" in capsys.readouterr().out


@pytest.mark.parametrize("status", ["unhealthy", None])
def test_no_healthy_triggerer_pokes_and_says_why(api_server, monkeypatch, capsys, status):
    api_server["body"] = health(status)
    s = sensor(monkeypatch)
    pokes = []
    monkeypatch.setattr(s, "poke", lambda context: pokes.append(1) or len(pokes) >= 3)
    s.execute({})  # pokes in the worker until due; never defers
    assert len(pokes) == 3
    out = capsys.readouterr().out
    assert f"status: {status or 'none running'}" in out and "poking from a worker instead (mode=poke" in out


def test_unreachable_api_server_is_no_triggerer(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", f"http://127.0.0.1:{free_port()}")
    healthy, why = triggerer_status(timeout=2)
    assert not healthy and "did not answer" in why and HEALTH_PATH in why


def test_explicit_choice_skips_the_probe(api_server, monkeypatch):
    api_server["body"] = health("unhealthy")
    with pytest.raises(TaskDeferred):
        sensor(monkeypatch, deferrable=True).execute({})
    s = sensor(monkeypatch, deferrable=False)
    monkeypatch.setattr(s, "poke", lambda context: True)
    s.execute({})
    assert api_server["paths"] == []


def test_base_url_from_the_execution_api_url(monkeypatch):
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", "https://airflow.example:8443/execution/")
    assert api_base_url() == "https://airflow.example:8443"


def test_trigger_ends_with_a_timeout_event_at_its_deadline(monkeypatch):
    """No change before ``timeout_at``: one ``timeout`` event (not a triggerer error)."""
    import asyncio
    import time

    from airflow_cdc.airflow.hooks.cdc import CdcHook
    from airflow_cdc.airflow.triggers.changes import CdcChangesTrigger

    checks = []

    async def no_changes(self, offset, check, partition, config):
        checks.append(time.monotonic())
        return False

    async def within_limits(self, partition, config):
        return None

    async def read_config(self, partition):
        return {"connector": "postgresql"}

    # the trigger's first step imports the hook's async half in a thread (pyarrow and the core):
    # done here first, so the deadline below measures polls, not an import under a loaded machine
    importlib.import_module("airflow_cdc.airflow.hooks.pg_async")
    monkeypatch.setattr(CdcHook, "achanges_after", no_changes)
    monkeypatch.setattr(CdcHook, "acheck_retained", within_limits)
    monkeypatch.setattr(CdcHook, "apartition", read_config)
    trigger = CdcChangesTrigger(pipeline={"name": "p"}, offset=OFFSET, poll_interval=0.2, timeout_at=time.time() + 1)
    assert trigger.serialize()[1]["timeout_at"] == trigger.timeout_at

    async def first_event():
        async for event in trigger.run():
            return event.payload

    started = time.monotonic()
    payload = asyncio.run(first_event())
    assert payload == {"status": "timeout", "offset": OFFSET, "polls": len(checks)}
    assert 0.9 < time.monotonic() - started < 3 and len(checks) >= 4


@pytest.mark.parametrize("soft_fail", [True, False])
def test_sensor_skips_or_times_out_on_the_timeout_event(monkeypatch, capsys, soft_fail):
    from airflow.sdk.exceptions import AirflowSensorTimeout, AirflowSkipException

    s = sensor(monkeypatch, soft_fail=soft_fail, deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        s.execute({})
    kwargs = deferred.value.trigger.serialize()[1]
    assert kwargs["timeout_at"] > 0 and deferred.value.timeout.total_seconds() > s.timeout
    expected = AirflowSkipException if soft_fail else AirflowSensorTimeout
    with pytest.raises(expected, match="no change past offset"):
        s.execute_complete({}, {"status": "timeout", "offset": OFFSET, "polls": 7})
    assert "(7 checks)" in capsys.readouterr().out
