"""Snapshot chunks read side by side by several connections inside one run (``snapshot.max.threads``).

A snapshot chunk is a key-ordered range read; one connection reads them one after another, so a
run's snapshot rows cost the server's index scans plus the row conversion, in series.  With
``snapshot.max.threads`` = N above 1, the run reads its snapshot rows with N readers instead:

- the capture's own connection hands out consecutive key ranges of the pending tables, in their
  order, ``span`` rows each (boundaries by the index-ordered ``OFFSET`` query of
  :meth:`ChangeSource.snapshot_bounds`, up to the table's ``max_key``), under a lock;
- each reader -- a source of its own (:meth:`ChangeSource.snapshot_reader`) on its own connection
  -- reads every range it takes to its end as ordinary watermarked chunks; a range is never cut
  short, since rows inserted into it after its boundary was found would otherwise fall between two
  ranges;
- the chunks come back in key order, one :class:`ChunkTracker` group per reader (a reader takes
  ranges in increasing order, so its chunks stay in its read order), and a table's last chunk is
  marked ``last`` only on its final range.

This is the in-process form of snapshot parts (:mod:`airflow_cdc.core.snapshot_parts`) and exact
for the same reason: every chunk is read after the window start, and chunks of different readers
are reconciled per reader.  A table chunked by a surrogate key (the ``surrogate-key`` of an ad
hoc snapshot, whose values may repeat) is not split: from there on the capture's connection reads the
rest of the run's budget as usual.  Memory is what one reader would hold: the run's
``snapshot.max.rows.per.run`` rows (plus rows inserted into ranges while they were read).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from airflow_cdc.core.snapshot import ChunkRead, TableSnapshot, captured_only
from airflow_cdc.core.source import ChangeSource

if TYPE_CHECKING:
    from airflow_cdc.core.capture import Capture

log = logging.getLogger(__name__)

#: rows per key range when ``incremental.snapshot.chunk.size`` is not set: large enough that the
#: boundary query and a range's round trips are a few per cent of reading it
DEFAULT_SPAN = 131_072
#: a range is read to its end, whatever the run's budget (see the module docstring)
WHOLE_RANGE = 1 << 62
#: seconds between progress lines while the readers work
PROGRESS_SECONDS = 10.0


def read_side_by_side(
    capture: Capture, pending: list[TableSnapshot], max_rows: int, threads: int, span: int, chunk_size: Any
) -> tuple[list[ChunkRead], list[int]]:
    """Up to ``max_rows`` snapshot rows of ``pending`` read by ``threads`` readers side by side.

    :returns: the chunks in key order (tables in ``pending`` order) and the reader of each.
    :raises Exception: what a reader raised first; the run then fails as a failed read would.
    """
    source = capture.source
    ranges = _Ranges(source, captured_only(pending, source.tables()), max_rows, max(1, min(span, max_rows)))
    started = time.monotonic()
    workers = [
        threading.Thread(target=ranges.read, args=(k,), name=f"snapshot-reader-{k}", daemon=True)
        for k in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if ranges.errors:
        raise ranges.errors[0]
    taken = sorted(ranges.taken, key=lambda t: t[0])  # key order
    chunks: list[ChunkRead] = []
    groups: list[int] = []
    for _, reader, snap, read, final in taken:
        reached = bool(read) and read[-1].last
        for chunk in read:
            chunk.snapshot, chunk.last = snap, False
            chunks.append(chunk)
            groups.append(reader)
        if final and reached:
            read[-1].last = True
    if taken:
        seconds = max(time.monotonic() - started, 1e-9)
        log.info(
            "snapshot: %d rows in %d chunk(s) of %s read by %d readers side by side in %.1fs (%.0f rows/s)",
            ranges.rows,
            len(chunks),
            ", ".join(dict.fromkeys(t[2].table for t in taken)),
            threads,
            seconds,
            ranges.rows / seconds,
        )
    rest = max_rows - ranges.rows
    if ranges.queue and ranges.current is None and rest > 0:
        # a surrogate-key table is next: the capture's connection reads on from it, as always
        more = source.read_chunks(ranges.queue, rest, chunk_size)
        chunks += more
        groups += [threads] * len(more)
    return chunks, groups


class _Ranges:
    """Consecutive key ranges of the pending tables, handed out to readers, and what they read."""

    def __init__(self, source: ChangeSource, tables: list[TableSnapshot], max_rows: int, span: int) -> None:
        self.source, self.queue, self.max_rows, self.span = source, list(tables), max_rows, span
        self.lock = threading.Lock()
        self.current: TableSnapshot | None = None  # the table ranges are handed out of
        self.lower: list | None = None  # where its next range starts (exclusive)
        self.index = 0
        self.rows = 0  # rows read by finished ranges (an empty range counts one, as budgets do)
        self.in_flight = 0  # rows of the ranges being read, as sized when handed out
        #: (range index, reader, table snapshot, chunks, final range of its table)
        self.taken: list[tuple[int, int, TableSnapshot, list[ChunkRead], bool]] = []
        self.errors: list[BaseException] = []
        self.started = self.logged = time.monotonic()

    def next(self) -> tuple[int, TableSnapshot, TableSnapshot, bool, int] | None:
        """The next range to read: (index, table snapshot, snapshot bounded to it, final, size)."""
        with self.lock:
            # ranges being read count as full: the run reads at most its budget, plus what
            # concurrent inserts add to ranges after their boundaries were found
            size = min(self.span, self.max_rows - self.rows - self.in_flight)
            if self.errors or size <= 0:
                return None
            if self.current is None:
                if not self.queue or self.queue[0].surrogate_key:
                    return None
                self.current = self.queue.pop(0)
                self.lower = self.current.last_key
            snap = self.current
            bounded = TableSnapshot.from_json({**snap.to_json(), "rows": 0, "chunks": 0})
            bounded.last_key = self.lower
            # one query: the range's end, and the table's max_key with its first range
            snap.max_key, bounds = self.source.snapshot_bounds(bounded, [size - 1])
            final = not bounds or bounds[0] == snap.max_key
            bounded.max_key = snap.max_key if final else bounds[0]
            self.lower = bounded.max_key
            if final:
                self.current = None
            self.in_flight += size
            self.index += 1
            return self.index - 1, snap, bounded, final, size

    def _progress(self) -> None:
        """A progress line (rows, rate, time left at most) every ``PROGRESS_SECONDS``; under the lock."""
        now = time.monotonic()
        if now - self.logged < PROGRESS_SECONDS:
            return
        self.logged = now
        rate = self.rows / max(now - self.started, 1e-9)
        table = self.current.table if self.current is not None else "the pending tables"
        log.info(
            "snapshot readers: %d of up to %d rows read (now in %s), %.0f rows/s, at most %.0fs left",
            self.rows,
            self.max_rows,
            table,
            rate,
            max(self.max_rows - self.rows, 0) / max(rate, 1e-9),
        )

    def read(self, reader: int) -> None:
        """One reader's loop: take ranges and read each to its end, on a source of its own."""
        own: ChangeSource | None = None
        try:
            try:
                own = self.source.snapshot_reader()
            except Exception as e:
                log.error(
                    "snapshot reader %d could not open its connection (snapshot.max.threads: lower it, or "
                    "raise the server's connection limit): %s",
                    reader,
                    e,
                )
                raise
            while (job := self.next()) is not None:
                index, snap, bounded, final, size = job
                chunks = own.read_chunks([bounded], WHOLE_RANGE, self.span)
                with self.lock:
                    self.taken.append((index, reader, snap, chunks, final))
                    self.rows += sum(max(c.data.num_rows, 1) for c in chunks)
                    self.in_flight -= size
                    self._progress()
        except BaseException as e:  # noqa: BLE001 - raised again in the capture's thread
            with self.lock:
                self.errors.append(e)
        finally:
            if own is not None:
                own.close()
