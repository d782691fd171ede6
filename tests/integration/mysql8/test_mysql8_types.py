"""The generated type-table test (:mod:`tests.integration.mysql.type_table`) on a real MySQL 8:
the same cases as on MariaDB (binary JSON is ``io.debezium.data.Json`` here) through snapshot
chunks, snapshot parts, the stream and the stream after an ALTER TABLE."""

from __future__ import annotations

import pytest

from tests.integration.mysql.type_table import TypeTable
from tests.integration.mysql8.conftest import SKIP_REASON, URL

pytestmark = pytest.mark.skipif(not URL, reason=SKIP_REASON)


def test_type_table_through_every_path(mysql8_db, tmp_path):
    table = TypeTable(mysql8_db, "mysql")
    mismatches = table.run(tmp_path)
    assert mismatches == {path: [] for path in mismatches}, {p: m[:40] for p, m in mismatches.items() if m}
