"""The source log kept for a connector, read live, and the guard that fails the sensor before the
server drops the connector's position or fills its disk.

A batch pipeline holds the source's log from its committed offset on: a PostgreSQL slot keeps WAL
until commit advances it; MySQL/MariaDB and SQL Server keep their binlog / change tables for a
time of their own, after which an offset older than that is lost.  Each source registers a reader
(:func:`register_retained`, its ``retained`` module) that measures what the server keeps and its
limit; the *position age* -- how long ago the source stood at the committed offset -- comes from
the committed batch's metrics, for every source.

The guard (:func:`evaluate`) trips when the retained bytes or the position age reach
``retained.log.max.fraction`` of the server's own limit, or the absolute ``retained.log.max.bytes``
/ ``retained.log.max.age.ms``, or the server says the position is (about to be) gone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import RetainedLogExceeded
from airflow_cdc.core.metrics import MetricsRecorder

log = logging.getLogger(__name__)


@dataclass
class RetainedLog:
    """What the server keeps for one connector now (``None``: the source cannot tell).

    :param retained_bytes: log the server keeps because of the connector (slot ``restart_lsn`` to
        the head; binlog from the committed offset's file on).
    :param behind_bytes: log between the committed offset and the head.
    :param lag_bytes: log between the offset silver reflects (the newest applied batch) and the head.
    :param files: binlog files from the committed one to the head.
    :param limit_bytes: the server's byte limit for it (``max_slot_wal_keep_size``), None: none.
    :param limit_age_ms: the server's age limit (binlog expiry, CDC cleanup retention).
    :param wal_status: PostgreSQL's ``wal_status`` of the slot.
    :param lost: the server no longer has what the committed offset needs.
    :param detail: a short description for ``status`` and the guard's message.
    """

    retained_bytes: int | None = None
    behind_bytes: int | None = None
    lag_bytes: int | None = None
    files: int | None = None
    limit_bytes: int | None = None
    limit_age_ms: int | None = None
    wal_status: str | None = None
    lost: bool = False
    detail: str = ""


#: reads the retained log of a connector: ``(config, committed offset, applied offset)``
Reader = Callable[[ConnectorConfig, dict[str, Any], "dict[str, Any] | None"], RetainedLog]
_READERS: dict[str, Reader] = {}


def register_retained(kinds: tuple[str, ...], reader: Reader) -> None:
    """Make ``reader`` measure the retained log of the connectors named ``kinds``."""
    for kind in kinds:
        _READERS[kind] = reader


def read_retained(
    config: ConnectorConfig, offset: dict[str, Any] | None, applied: dict[str, Any] | None = None
) -> RetainedLog | None:
    """The source's retained log for the committed ``offset`` (None: no offset yet, or no reader).

    :raises CdcError: the server cannot be reached or refused the queries.
    """
    import airflow_cdc.sources  # noqa: F401 - the built-in sources register their readers

    reader = _READERS.get(str(config["connector"]))
    if reader is None or offset is None:
        return None
    return reader(config, offset, applied)


@dataclass(frozen=True)
class Verdict:
    """The guard's decision and the limits it applied (0: none)."""

    tripped: bool
    limit_bytes: int
    limit_age_ms: int
    used: float | None
    message: str


def _limit(explicit: int, fraction: float, server: int | None) -> int:
    derived = int(fraction * server) if fraction > 0 and server else 0
    return min(x for x in (explicit, derived) if x) if explicit or derived else 0


def evaluate(config: ConnectorConfig, retained: RetainedLog | None, position_age_ms: int | None) -> Verdict:
    """Decide whether the retained log is past the connector's limits (see the module docstring)."""
    fraction = float(config["retained.log.max.fraction"])
    retained = retained or RetainedLog()
    max_bytes = _limit(int(config["retained.log.max.bytes"]), fraction, retained.limit_bytes)
    max_age = _limit(int(config["retained.log.max.age.ms"]), fraction, retained.limit_age_ms)
    used = [
        value / limit
        for value, limit in ((retained.retained_bytes, max_bytes), (position_age_ms, max_age))
        if value is not None and limit
    ]
    reasons = []
    if retained.lost or retained.wal_status in ("lost", "unreserved"):
        reasons.append(f"the server is dropping or dropped the log the committed offset needs "
                       f"({retained.wal_status or 'lost'})")  # fmt: skip
    if max_bytes and retained.retained_bytes is not None and retained.retained_bytes >= max_bytes:
        reasons.append(
            f"it keeps {_size(retained.retained_bytes)} of log for the connector, over the limit of "
            f"{_size(max_bytes)} ({_why(config, 'bytes', fraction, retained.limit_bytes, _size)})"
        )
    if max_age and position_age_ms is not None and position_age_ms >= max_age:
        reasons.append(
            f"the committed position is {_age(position_age_ms)} old, over the limit of {_age(max_age)} "
            f"({_why(config, 'age.ms', fraction, retained.limit_age_ms, _age)})"
        )
    message = ""
    if reasons:
        where = f"; {retained.detail}" if retained.detail else ""
        message = f"connector {config.state_name!r}: {'; '.join(reasons)}{where}"
    return Verdict(bool(reasons), max_bytes, max_age, max(used) if used else None, message)


def _why(config: ConnectorConfig, unit: str, fraction: float, server: int | None, show: Callable) -> str:
    explicit = int(config[f"retained.log.max.{unit}"])
    derived = int(fraction * server) if fraction > 0 and server else 0
    if derived and (not explicit or derived <= explicit):
        return f"retained.log.max.fraction={fraction:g} of the server's {show(server)}"
    return f"retained.log.max.{unit}={explicit}"


def check(config: ConnectorConfig, retained: RetainedLog | None, position_age_ms: int | None) -> Verdict:
    """:func:`evaluate`, raising when the guard trips.

    :raises RetainedLogExceeded: naming the connector, what the source keeps and the limit.
    """
    verdict = evaluate(config, retained, position_age_ms)
    if verdict.tripped:
        raise RetainedLogExceeded(verdict.message)
    return verdict


def record(
    recorder: MetricsRecorder, retained: RetainedLog | None, position_age_ms: int | None, verdict: Verdict
) -> None:
    """Put the retained log, the position age and the guard's limits into ``recorder``."""
    if retained is not None:
        recorder.set("source", "RetainedLogBytes", retained.retained_bytes)
        recorder.set("source", "RetainedLogFiles", retained.files)
        recorder.set("source", "BehindBytes", retained.behind_bytes)
        recorder.set("source", "WalStatus", retained.wal_status)
        recorder.set("source", "RetainedLogDetail", retained.detail or None)
        recorder.set("silver", "LagBytes", retained.lag_bytes)
    recorder.set("source", "PositionAgeMs", position_age_ms)
    recorder.set("source", "RetainedLogLimitBytes", verdict.limit_bytes)
    recorder.set("source", "RetainedLogLimitAgeMs", verdict.limit_age_ms)
    recorder.set(
        "source", "RetainedLogUsedFraction", None if verdict.used is None else round(verdict.used, 4)
    )
    recorder.set("source", "RetainedLogGuardTripped", int(verdict.tripped))


def age_ms(position_time_ms: float | None, now: float | None = None) -> int | None:
    """Milliseconds since ``position_time_ms`` (None stays None)."""
    if position_time_ms is None:
        return None
    return max(0, int((now if now is not None else time.time()) * 1000 - position_time_ms))


def _size(n: int | None) -> str:
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _age(ms: int | None) -> str:
    seconds = (ms or 0) / 1000
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
