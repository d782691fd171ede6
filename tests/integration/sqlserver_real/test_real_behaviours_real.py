"""The real-server behaviours of issue 31 (deferred updates, a capture instance without a start LSN,
local commit times and filler rows, large values and computed columns) against a real SQL Server:
the very test functions the emulator runs in ``tests/integration/sqlserver/test_real_behaviours.py``,
collected here with a ``target`` fixture over the configured server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.sqlserver.targets import RealTarget
from tests.integration.sqlserver.test_real_behaviours import (
    test_capture_instance_without_start_lsn_loses_nothing,
    test_commit_times_are_utc_and_filler_rows_wake_nothing,
    test_deferred_updates_get_distinct_positions_and_converge,
    test_large_values_and_computed_columns,
)
from tests.integration.sqlserver_real.harness_real import RealDb

pytestmark = pytest.mark.integration

__all__ = [
    "test_capture_instance_without_start_lsn_loses_nothing",
    "test_commit_times_are_utc_and_filler_rows_wake_nothing",
    "test_deferred_updates_get_distinct_positions_and_converge",
    "test_large_values_and_computed_columns",
]


@pytest.fixture
def target(real_db: RealDb, tmp_path: Path) -> Iterator[RealTarget]:
    yield RealTarget(real_db.name, tmp_path / "staging", "real", server=real_db.server)
