"""The fetch-ahead helper: order, errors in the fetching thread, early stop by the consumer."""

from __future__ import annotations

import threading

import pytest

from airflow_cdc.sources.postgres.client import prefetch


class FakeCursor:
    def __init__(self, batches: int, fail_at: int | None = None) -> None:
        self.left, self.fail_at, self.calls = batches, fail_at, 0
        self.threads: set[str] = set()

    def fetchmany(self, size: int) -> list[tuple[int, bytes]]:
        self.calls += 1
        self.threads.add(threading.current_thread().name)
        if self.fail_at is not None and self.calls == self.fail_at:
            raise RuntimeError("server went away")
        if self.left == 0:
            return []
        self.left -= 1
        return [(self.calls, b"x")] * size


def _helpers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "airflow-cdc-prefetch"]


def test_yields_every_batch_in_order_from_a_helper_thread() -> None:
    cur = FakeCursor(5)
    got = [b[0][0] for b in prefetch(cur, 3)]
    assert got == [1, 2, 3, 4, 5]
    assert cur.threads == {"airflow-cdc-prefetch"}
    assert not _helpers()


def test_fetch_error_reaches_the_consumer_after_earlier_batches() -> None:
    seen = []
    with pytest.raises(RuntimeError, match="server went away"):
        for batch in prefetch(FakeCursor(10, fail_at=3), 2):
            seen.append(batch[0][0])
    assert seen == [1, 2]
    assert not _helpers()


def test_consumer_stopping_early_stops_the_thread_before_returning() -> None:
    cur = FakeCursor(1000)
    with pytest.raises(ValueError):
        for _ in prefetch(cur, 1, depth=2):
            raise ValueError("decoder failed")
    assert not _helpers()
    assert cur.calls <= 4  # fetched at most the queue depth plus the one in flight ahead
