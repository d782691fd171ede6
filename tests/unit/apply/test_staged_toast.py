"""A staged part proves from its Parquet statistics that no event lists unchanged-TOAST columns,
so the apply job can skip the TOAST fill and MERGE without reading stored values; a part with
one such event does not."""

from __future__ import annotations

import random

from spark_jobs.cdc_apply.staged import StagedBatch
from tests.integration.spark.history_model import UNSENT, Event
from tests.integration.spark.test_history import write_batches


def _events(unsent: bool) -> list[Event]:
    row = {"id": 1, "a": 1, "b": "x", "x": "y"}
    return [
        Event(1, "r", 1, dict(row)),
        Event(2, "u", 1, {**row, "a": 2}),
        Event(3, "u", 1, {**row, "a": 3, "b": UNSENT if unsent else "z"}),
        Event(4, "d", 1),
    ]


def test_parts_without_unsent_values_say_so(tmp_path):
    for unsent in (False, True):
        (batch,) = write_batches(tmp_path / str(unsent), _events(unsent), 1, random.Random(1))
        (table,) = StagedBatch(str(batch)).tables()
        assert table.toast is unsent
