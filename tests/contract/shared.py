"""What contract modules share: their ``harness`` fixture (:func:`harness_over` a list of source
kinds), the staged name of a harness's table, and a table's staged events."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.pipeline import build_config
from tests.contract.harness import DB_FIXTURES, HARNESSES, Harness

SQL_KINDS = ["postgresql", "mariadb", "sqlserver"]


def harness_over(kinds: Sequence[str]) -> Any:
    """A ``harness`` fixture: a harness on a fresh database of each source kind in ``kinds``
    (assign it to ``harness`` in the test module)."""

    @pytest.fixture(params=list(kinds), name="harness")
    def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Harness:
        db = request.getfixturevalue(DB_FIXTURES[request.param])
        return HARNESSES[request.param](db, tmp_path / "staging")

    return harness


def staged_table(h: Harness, name: str) -> str:
    """The name the harness's table ``name`` is staged under (SQL Server: with its database)."""
    named = getattr(h, "staged", None)
    return named(h.table(name)) if named else h.table(name)


def staged_events(config: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """Every staged event of ``table`` (its staged name), batch after batch."""
    name = build_config(config).state_name
    return [
        e
        for b in list_batches(config["staging.path"], name)
        if table in b.tables()
        for rb in b.iter_events(table)
        for e in rb.to_pylist()
    ]
