"""Trigger that waits, in the triggerer, until a CDC source has changes past the committed offset."""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_cdc.core.errors import CdcError


class CdcChangesTrigger(BaseTrigger):
    """Poll the source's head cheaply until it moved past ``offset``; fire one small event.

    ``run()`` never blocks the event loop: PostgreSQL is asked through psycopg's
    ``AsyncConnection``; file and Connection reads and other sources run in worker threads.  Each
    poll also applies the retained-log guard; a tripped guard ends the wait with an ``error``
    event naming ``RetainedLogExceeded``, which fails the sensor without retries.
    Retryable errors (server unreachable, slot busy) are logged and polling goes on; any other
    error ends the wait with an ``error`` event.  Nothing is opened in ``__init__``.

    :param pipeline: pipeline file path, or mapping without literal secrets (see ``serialize``).
    :param offset: the committed offset (JSON), e.g. ``{"lsn": "0/16B3748"}``.
    :param cdc_conn_id: Airflow Connection of the source database.
    :param check: ``wal`` (flushed WAL / binlog head past the offset), ``slot`` (PostgreSQL: the
        server peeks one change) or ``gtid`` (MySQL: a captured GTID the offset lacks).
    :param poll_interval: seconds between checks.
    :param partition: the partition of a partitioned connector whose offset this is.
    :param timeout_at: epoch seconds after which the wait ends with a ``timeout`` event (no change
        in time is a normal outcome: the sensor skips, and the triggerer logs no error).
    """

    def __init__(
        self,
        *,
        pipeline: str | Mapping[str, Any],
        offset: dict[str, Any],
        cdc_conn_id: str | None = None,
        check: str | None = None,
        poll_interval: float = 60.0,
        partition: str | None = None,
        timeout_at: float | None = None,
    ) -> None:
        super().__init__()
        self.partition = partition
        self.timeout_at = timeout_at
        self.pipeline = pipeline if isinstance(pipeline, str) else dict(pipeline)
        self.offset = dict(offset)
        self.cdc_conn_id = cdc_conn_id
        self.check = check
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "offset": self.offset,
                "cdc_conn_id": self.cdc_conn_id,
                "check": self.check,
                "poll_interval": self.poll_interval,
                "partition": self.partition,
                "timeout_at": self.timeout_at,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        # the first import of the hook pulls in the core (pyarrow ...): in a thread, not on the
        # triggerer's event loop (the triggerer flagged 0.2-0.4 s blocks)
        await asyncio.to_thread(importlib.import_module, "airflow_cdc.airflow.hooks.pg_async")
        from airflow_cdc.airflow.hooks.cdc import CdcHook

        hook = CdcHook(pipeline=self.pipeline, cdc_conn_id=self.cdc_conn_id)
        polls = 0
        while True:
            polls += 1
            try:
                # one read of the pipeline and its Connection a poll, for the guard and the check
                config = await hook.apartition(self.partition)
                await hook.acheck_retained(self.partition, config)  # the guard (retained.log.max.*)
                if await hook.achanges_after(self.offset, self.check, self.partition, config):
                    yield TriggerEvent({"status": "changes", "offset": self.offset, "polls": polls})
                    return
            except CdcError as e:
                if not e.retryable:
                    event = {"status": "error", "message": str(e), "error": type(e).__name__, "polls": polls}
                    yield TriggerEvent(event)
                    return
                self.log.warning("change check failed, retrying in %.0fs: %s", self.poll_interval, e)
            except Exception as e:  # noqa: BLE001 - e.g. the slot is in use by a running capture
                self.log.warning("change check failed, retrying in %.0fs: %s", self.poll_interval, e)
            if self.timeout_at is not None:
                left = self.timeout_at - time.time()
                if left <= 0:
                    yield TriggerEvent({"status": "timeout", "offset": self.offset, "polls": polls})
                    return
                await asyncio.sleep(min(self.poll_interval, left))
            else:
                await asyncio.sleep(self.poll_interval)
