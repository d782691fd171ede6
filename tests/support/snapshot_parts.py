"""Snapshot parts in tests: plan and read every part in parallel threads, count the capture's loads."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from airflow_cdc.core import snapshot_parts
from airflow_cdc.core.pipeline import build_capture


def prepare(config: dict[str, Any], parts: int) -> str | None:
    """Plan, then read every part in its own thread (each with its own source connection)."""
    planned = snapshot_parts.plan_parts(build_capture(config), parts)
    if not planned:
        return None
    errors: list[BaseException] = []

    def read(p: dict[str, Any]) -> None:
        try:
            snapshot_parts.read_part(build_capture(config), p["plan"], p["part"])
        except BaseException as e:  # reported by the test thread
            errors.append(e)

    threads = [threading.Thread(target=read, args=(p,)) for p in planned]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return planned[0]["plan"]


def count_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    loaded: list[int] = []
    real = snapshot_parts.load_parts

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        loaded.append(len(out.chunks) if out is not None else 0)
        return out

    monkeypatch.setattr(snapshot_parts, "load_parts", spy)
    return loaded
