"""Whether a triggerer is there to run deferred tasks: the API server's health endpoint says.

A task cannot see the scheduler's database in Airflow 3; the API server's unauthenticated
``/api/v2/monitor/health`` reports the triggerer's status from its heartbeat.  Used by the sensor
to defer by default only where deferring can work.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from airflow.sdk.configuration import conf

HEALTH_PATH = "/api/v2/monitor/health"
DEFAULT_BASE = "http://localhost:8080"


def api_base_url() -> str:
    """The API server's base URL: ``[api] base_url``, else the scheme and host of
    ``[core] execution_api_server_url``, else Airflow's default."""
    base = conf.get("api", "base_url", fallback=None)
    if base:
        return base.rstrip("/")
    execution = conf.get("core", "execution_api_server_url", fallback=None)
    if execution:
        parts = urlsplit(execution)
        return urlunsplit((parts.scheme, parts.netloc, "", "", ""))
    return DEFAULT_BASE


def triggerer_status(timeout: float = 3.0) -> tuple[bool, str]:
    """(a healthy triggerer is running, why) -- never raises."""
    url = api_base_url() + HEALTH_PATH
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - configured URL
            data = json.load(response)
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        return False, f"the API server's health endpoint {url} did not answer ({reason})"
    triggerer = (data.get("triggerer") if isinstance(data, dict) else None) or {}
    status = triggerer.get("status")
    if status == "healthy":
        return True, f"triggerer healthy (last heartbeat {triggerer.get('latest_triggerer_heartbeat')})"
    return False, f"no healthy triggerer per {url} (status: {status or 'none running'})"
