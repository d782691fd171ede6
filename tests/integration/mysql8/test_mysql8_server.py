"""The MySQL source against a real MySQL 8 server (binary JSON, v2 rows events, uuid GTID sets,
``SHOW BINARY LOG STATUS`` on 8.4, ``caching_sha2_password``).

No MySQL 8 can run on the CI machine (no Docker, no MySQL packages), so this suite runs only when
``AIRFLOW_CDC_MYSQL8_URL`` names a server, e.g. ``mysql://root:pw@127.0.0.1:3306`` of
``docker run -e MYSQL_ROOT_PASSWORD=pw -p 3306:3306 mysql:8.4 --gtid-mode=ON
--enforce-gtid-consistency=ON`` (binlog and ROW format are MySQL 8 defaults).  Each test works in a
database of its own, dropped afterwards.
"""

from __future__ import annotations

import pytest

from tests.integration.mysql.support import assert_converged, execute, pipeline, run_capture, state
from tests.integration.mysql8.conftest import SKIP_REASON, URL

pytestmark = pytest.mark.skipif(not URL, reason=SKIP_REASON)


def test_capture_converges_with_uuid_gtid_offsets(mysql8_db, tmp_path):
    db = mysql8_db
    execute(
        db,
        "CREATE TABLE t (id int PRIMARY KEY, j json, d decimal(40,10), tm time(6), u bigint unsigned, "
        "g geometry, e enum('x','y'), s set('a','b'), b bit(10))",
        "INSERT INTO t VALUES (1, '{\"k\": [1, 2]}', 1.5, '-838:59:59', 18446744073709551615, "
        "ST_GeomFromText('POINT(1 2)'), 'y', 'a,b', b'1010101010')",
    )
    config = pipeline(db, tmp_path / "staging", connector="mysql")
    run_capture(config)
    offset = state(config).data["offset"]
    assert ":" in offset["gtids"], "MySQL 8 offsets carry a uuid:interval GTID set"
    from airflow_cdc.core.pipeline import build_config
    from airflow_cdc.sources.mysql.source import MySqlSource

    source = MySqlSource(build_config(config))
    assert source.changes_after(offset, "gtid") is False
    execute(
        db,
        'INSERT INTO t (id, j) VALUES (2, \'{"a": {"b": null}}\')',
        "UPDATE t SET j = JSON_SET(j, '$.k', 3), tm = '12:00:00.5' WHERE id = 1",
        "ALTER TABLE t ADD COLUMN extra int NULL",
        "UPDATE t SET extra = 7, id = 3 WHERE id = 2",
    )
    assert source.changes_after(offset, "gtid") is True and source.changes_after(offset, "binlog") is True
    result = run_capture(config)
    assert result.events == 3
    assert_converged(config, [f"{db.name}.t"])
