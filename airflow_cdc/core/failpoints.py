"""Fault injection for crash tests: ``AIRFLOW_CDC_FAILPOINTS=name[:probability],...``.

At a named point the process kills itself with SIGKILL (no cleanup, no flush), exactly like an
OOM kill or a lost node.  Unset in production: the check is one dict lookup.
"""

from __future__ import annotations

import os
import random
import signal

_ENV = "AIRFLOW_CDC_FAILPOINTS"


def _parse(text: str) -> dict[str, float]:
    points = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, _, prob = item.partition(":")
        points[name] = float(prob) if prob else 1.0
    return points


def failpoint(name: str) -> None:
    """SIGKILL this process if failpoint ``name`` is armed (with its probability)."""
    text = os.environ.get(_ENV)
    if not text:
        return
    prob = _parse(text).get(name)
    if prob is not None and random.random() < prob:
        os.kill(os.getpid(), signal.SIGKILL)
