"""Crash injection for the apply job's kill tests (``AIRFLOW_CDC_FAILPOINTS=name[:probability]``).

Kills the whole process group with SIGKILL: under ``spark-submit`` that is the JVM driver and
the Python process together, as when a node dies.  Unset in production.
"""

from __future__ import annotations

import os
import random
import signal


def crash_point(name: str) -> None:
    armed = dict(
        (item.partition(":")[0], float(item.partition(":")[2] or 1))
        for item in os.environ.get("AIRFLOW_CDC_FAILPOINTS", "").split(",")
        if item.strip()
    )
    if name in armed and random.random() < armed[name]:
        os.killpg(os.getpgid(0), signal.SIGKILL)
