"""``database.initial.statements`` split as Debezium splits it (``parseSqlStatementString``)."""

from __future__ import annotations

import pytest

from airflow_cdc.core.session_sql import split_statements


@pytest.mark.parametrize(
    ("text", "statements"),
    [
        (None, []),
        ("", []),
        ("SET a = 1", ["SET a = 1"]),
        ("SET a = 1;", ["SET a = 1"]),
        ("SET a = 1; SET b = 2;", ["SET a = 1", "SET b = 2"]),
        ("SET application_name = 'x;;y'; SET b = 2", ["SET application_name = 'x;y'", "SET b = 2"]),
        ("a;;;b", ["a;", "b"]),  # an escaped ; then the delimiter
        ("a;;;;b", ["a;;b"]),
        (" ; ;a; ", ["a"]),
        ("a;;", ["a;"]),
    ],
)
def test_split_like_debezium(text, statements):
    assert split_statements(text) == statements
