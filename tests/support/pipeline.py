"""Source-independent test helpers: run a capture, replay staged batches, compare with the source."""

from __future__ import annotations

from typing import Any

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.pipeline import build_capture
from tests.support.oracle import ReferenceApplier


def run_capture(config: dict[str, Any], commit: bool = True, signals: list | None = None) -> Any:
    return build_capture(config).run(signals=signals, commit=commit)


def replay(config: dict[str, Any]) -> ReferenceApplier:
    oracle = ReferenceApplier()
    oracle.apply_batches(list_batches(config["staging.path"], config["name"]))
    return oracle


def assert_rows_equal(
    table: str,
    expected: dict[tuple, dict[str, Any]],
    got: dict[tuple, dict[str, Any]],
    lenient_columns: bool = False,
) -> None:
    """Compare keyed rows.  With ``lenient_columns`` only the source's current columns count and a
    column a replayed row lacks is NULL: ``ADD COLUMN`` / ``DROP COLUMN`` write no row events."""
    if lenient_columns:
        got = {k: {c: (v or {}).get(c) for c in (expected.get(k) or v)} for k, v in got.items()}
    missing = expected.keys() - got.keys()
    extra = got.keys() - expected.keys()
    wrong = [k for k in expected.keys() & got.keys() if expected[k] != got[k]]
    assert not missing and not extra and not wrong, (
        f"{table}: {len(missing)} missing, {len(extra)} extra, {len(wrong)} different of {len(expected)}; "
        f"e.g. missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}, "
        f"different {[(k, _diff(expected[k], got[k])) for k in wrong[:3]]}"
    )


def _diff(expected: dict[str, Any] | None, got: dict[str, Any] | None) -> dict[str, tuple[str, str]]:
    """The differing columns of two rows as (expected, got), long values shortened."""
    if expected is None or got is None:
        return {"(row)": (_short(expected), _short(got))}
    cols = expected.keys() | got.keys()
    return {c: (_short(expected.get(c)), _short(got.get(c))) for c in sorted(cols) if expected.get(c) != got.get(c)}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}...({len(text)} chars)"
