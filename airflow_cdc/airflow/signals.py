"""Ad hoc snapshot requests from a DAG run: run conf (Debezium ``execute-snapshot`` /
``stop-snapshot`` data) and the trigger form (DAG ``params``), turned into core signals.

Accepted run conf (``airflow dags trigger --conf '...'``)::

    {"type": "execute-snapshot", "data": {"data-collections": ["public.orders"],
      "additional-conditions": [{"data-collection": "public.orders", "filter": "id > 100"}]}}
    {"execute-snapshot": {...data...}}            # shorthand, also "stop-snapshot"
    {"signals": [<signal>, ...]}                  # several at once

The trigger form fills ``snapshot_tables``, ``snapshot_filter``, ``surrogate_key`` and
``stop_snapshot`` (see :data:`FORM_FIELDS`).  Pure functions, no Airflow import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.signals import parse_signal

#: Trigger-form param names.
FORM_FIELDS = ("snapshot_tables", "snapshot_filter", "surrogate_key", "stop_snapshot")
_ACTIONS = ("execute-snapshot", "stop-snapshot")


def _conf_signals(conf: Mapping[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if conf.get("type") in _ACTIONS and "data" in conf:
        out.append({"type": conf["type"], "data": conf["data"]})
    for action in _ACTIONS:
        if action in conf:
            out.append({"type": action, "data": conf[action]})
    listed = conf.get("signals") or []
    if not isinstance(listed, list):
        raise ConfigError("run conf 'signals' must be a list of execute-snapshot / stop-snapshot signals")
    out.extend(dict(s) for s in listed)
    return out


def _tables(value: Any) -> list[str]:
    if isinstance(value, str):
        return [t.strip() for t in value.replace("\n", ",").split(",") if t.strip()]
    return [str(t).strip() for t in value or [] if str(t).strip()]


def _form_signals(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    tables = _tables(params.get("snapshot_tables"))
    out: list[dict[str, Any]] = []
    if params.get("stop_snapshot"):
        out.append({"type": "stop-snapshot", "data": {"data-collections": tables, "type": "incremental"}})
        return out
    if not tables:
        if params.get("snapshot_filter") or params.get("surrogate_key"):
            raise ConfigError("trigger form: a snapshot filter or surrogate key needs snapshot_tables")
        return out
    data: dict[str, Any] = {"data-collections": tables, "type": "incremental"}
    condition = str(params.get("snapshot_filter") or "").strip()
    if condition:
        data["additional-conditions"] = [{"data-collection": t, "filter": condition} for t in tables]
    if params.get("surrogate_key"):
        data["surrogate-key"] = str(params["surrogate_key"]).strip()
    out.append({"type": "execute-snapshot", "data": data})
    return out


def signals_from_run(
    conf: Mapping[str, Any] | None, params: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """All snapshot signals a DAG run asks for, validated (returned as plain JSON for XCom/logs).

    :raises ConfigError: naming the malformed field.
    """
    found = _conf_signals(conf or {}) + _form_signals(params or {})
    for sig in found:
        parse_signal(sig)  # validate now: a bad request fails the run before anything is captured
    unique: list[dict[str, Any]] = []
    for sig in found:  # the form's values are also in the conf when triggered from the UI
        if sig not in unique:
            unique.append(sig)
    return unique
