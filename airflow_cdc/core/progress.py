"""Progress lines for long work: rows, rate and ETA, at most every few seconds."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("airflow_cdc.progress")


class Progress:
    """Logs ``<what>: <rows> rows, <rate> rows/s, <pct>%, ETA <s>`` while work goes on.

    :param total: expected units of ``done`` (rows, bytes of WAL ...), or None when unknown.
    """

    def __init__(self, what: str, total: int | None = None, unit: str = "rows", every_s: float = 5.0) -> None:
        self.what, self.total, self.unit, self.every_s = what, total, unit, every_s
        self.start = self._last = time.monotonic()

    def update(self, rows: int, done: int | None = None) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        elapsed = max(now - self.start, 1e-9)
        line = f"{self.what}: {rows:,} rows, {rows / elapsed:,.0f} rows/s"
        if self.total and done is not None and done > 0:
            frac = min(done / self.total, 1.0)
            eta = elapsed * (1 - frac) / frac if frac > 0 else float("nan")
            line += f", {frac:.0%} of {self.unit}, ETA {eta:,.0f}s"
        log.info(line)

    def finish(self, rows: int) -> float:
        elapsed = time.monotonic() - self.start
        if elapsed >= self.every_s:
            log.info(
                "%s: done, %s rows in %.1fs (%s rows/s)",
                self.what,
                f"{rows:,}",
                elapsed,
                f"{rows / max(elapsed, 1e-9):,.0f}",
            )
        return elapsed
