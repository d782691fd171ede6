"""Read silver back into the Debezium encoding the capture tests compare with.

The inverse mapping here is written independently of ``spark_jobs.cdc_apply.types`` (plain
Python on collected values), so comparing silver with the source also checks the conversions.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from airflow_cdc.core.batch import list_batches
from spark_jobs.cdc_apply.layout import table_path

EPOCH = dt.datetime(1970, 1, 1)
EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
META = {"__position", "__op", "__ts_ms", "__batch_id", "__deleted", "__pending"}


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _time_micros(text: str) -> int:
    sign = -1 if text.startswith("-") else 1
    h, m, s = text.lstrip("-").split(":")
    sec, _, frac = s.partition(".")
    return sign * (((int(h) * 60 + int(m)) * 60 + int(sec)) * 1_000_000 + int((frac + "000000")[:6]))


def _unsigned_bigint(field: pa.Field | None) -> bool:
    """A MySQL ``BIGINT UNSIGNED`` staged as a (wrapped) int64: silver holds it unwrapped."""
    words = ((field.metadata or {}).get(b"mysql.type", b"") if field is not None else b"").split()
    return bool(words) and words[0].startswith(b"bigint") and b"unsigned" in words


def _name(field: pa.Field | None) -> str:
    return ((field.metadata or {}).get(b"connect.name", b"") if field is not None else b"").decode()


def _element(field: pa.Field | None) -> pa.Field | None:
    if field is not None and pa.types.is_list(field.type):
        return field.type.value_field
    return None


def to_debezium(value: Any, field: pa.Field | None) -> Any:
    """One silver value back in the staged encoding of ``field`` (the staged Arrow field)."""
    if value is None:
        return None
    if isinstance(value, list):
        return [to_debezium(v, _element(field)) for v in value]
    name = _name(field)
    base = name.rsplit(".", 1)[-1] if name else ""
    if base == "Date":
        return (value - EPOCH.date()).days
    if base == "MicroTimestamp":
        return _micros(value - EPOCH)
    if base == "Timestamp":
        return _micros(value - EPOCH) // 1000
    if base == "ZonedTimestamp":
        return value.astimezone(dt.UTC)
    if base == "MicroTime":
        return _time_micros(value)
    if base == "Time":
        return _time_micros(value) // 1000
    if base in ("VariableScaleDecimal", "Decimal") and isinstance(value, str):  # beyond 38 digits
        return Decimal(value)
    if _unsigned_bigint(field) and pa.types.is_int64(field.type):  # type: ignore[union-attr]
        return int(value) - (1 << 64) if value >= 1 << 63 else int(value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _exact_decimal(unscaled: bytes, scale: int) -> Decimal:
    """Debezium's unscaled two's complement bytes as a Decimal, exact at any precision."""
    return Decimal(f"{int.from_bytes(unscaled, 'big', signed=True)}E{-scale}")


def normalise(value: Any, field: pa.Field | None) -> Any:
    """A staged (Debezium) value in a form comparable with :func:`to_debezium` output."""
    if value is None:
        return None
    if isinstance(value, list):
        return [normalise(v, _element(field)) for v in value]
    name = _name(field)
    base = name.rsplit(".", 1)[-1] if name else ""
    if base == "ZonedTimestamp":
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(dt.UTC)
    if base == "VariableScaleDecimal":
        return _exact_decimal(value["value"], value["scale"])
    if base == "Decimal" and isinstance(value, bytes):  # Debezium's unscaled bytes (> 38 digits)
        scale = int(json.loads((field.metadata or {})[b"connect.parameters"])["scale"])  # type: ignore[union-attr]
        return _exact_decimal(value, scale)
    return value


def semantic_names(config: dict[str, Any], table: str) -> dict[str, pa.Field]:
    """Column -> staged Arrow field (with its Connect metadata), from the newest part of ``table``."""
    import pyarrow.parquet as pq

    for batch in reversed(list_batches(config["staging.path"], config["name"])):
        if table in batch.tables():
            after = pq.read_schema(batch.parts(table)[-1]).field("after").type
            return {f.name: f for f in after}
    raise AssertionError(f"no staged batch has {table}")


def silver_rows(
    spark: Any,
    target: str,
    config: dict[str, Any],
    table: str,
    keys: list[str],
    include_deleted: bool = False,
) -> dict[tuple, dict[str, Any]]:
    names = semantic_names(config, table)
    frame = spark.read.format("delta").load(table_path(target, "silver", config["name"], table))
    arrow: pa.Table = frame.toArrow()
    out = {}
    for row in arrow.to_pylist():
        if row.get("__deleted") and not include_deleted:
            continue
        data = {k: to_debezium(v, names.get(k)) for k, v in row.items() if k not in META}
        out[tuple(data[k] for k in keys)] = data
    return out


def silver_multiset(spark: Any, target: str, config: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """Every row of a keyless table's silver (duplicates included), in the staged encoding."""
    names = semantic_names(config, table)
    frame = spark.read.format("delta").load(table_path(target, "silver", config["name"], table))
    return [
        {k: to_debezium(v, names.get(k)) for k, v in row.items() if k not in META}
        for row in frame.toArrow().to_pylist()
    ]


def normalised_list(rows: list[dict[str, Any]], names: dict[str, pa.Field]) -> list[dict[str, Any]]:
    """:func:`normalised_rows` of a list of rows (a keyless table's)."""
    return [{c: normalise(v, names.get(c)) for c, v in row.items()} for row in rows]


def normalised_rows(
    rows: dict[tuple, dict[str, Any]], names: dict[str, pa.Field]
) -> dict[tuple, dict[str, Any]]:
    return {k: {c: normalise(v, names.get(c)) for c, v in row.items()} for k, row in rows.items()}


def diff(expected: dict[tuple, dict[str, Any]], got: dict[tuple, dict[str, Any]]) -> str:
    missing = expected.keys() - got.keys()
    extra = got.keys() - expected.keys()
    wrong = [k for k in expected.keys() & got.keys() if expected[k] != got[k]]
    if not (missing or extra or wrong):
        return ""

    def short(v: Any) -> str:
        text = repr(v)
        return text if len(text) < 80 else text[:60] + f"...({len(text)} chars)"

    sample = [
        (
            k,
            {
                c: (short(expected[k].get(c)), short(got[k].get(c)))
                for c in expected[k]
                if expected[k].get(c) != got[k].get(c)
            },
        )
        for k in sorted(wrong)[:3]
    ]
    return (
        f"{len(missing)} missing, {len(extra)} extra, {len(wrong)} different of {len(expected)}; "
        f"missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}, different {sample}"
    )


def apply_backlog(spark: Any, batches: list[Any], target: str, settings: Any = None) -> dict[str, Any]:
    """Apply staged batches as the CLI does, in one ``apply_batches`` pass, and check that some
    table's stretch did span several batches (capture manifests chain their offsets)."""
    from spark_jobs.cdc_apply.job import apply_batches

    report = apply_batches(spark, [str(b.path) for b in batches], target, settings)
    spans = [
        stretch.get("batches", 1)
        for done in report["tables"].values()
        for stretch in done.get("stretches", [done])
    ]
    assert len(batches) < 2 or max(spans, default=1) > 1, f"no stretch spans two batches: {report}"
    return report


class Crashed(Exception):
    """A fail point reached in-process (where a SIGKILL would stop the apply job)."""


@contextmanager
def crash_at(monkeypatch: Any, module: Any, name: str) -> Iterator[None]:
    """Run the block with ``module.crash_point`` raising :class:`Crashed` at the fail point
    ``name``; the block must reach it."""

    def crash(point: str) -> None:
        if point == name:
            raise Crashed(point)

    with monkeypatch.context() as patch:
        patch.setattr(module, "crash_point", crash)
        with pytest.raises(Crashed):
            yield


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, None if x is None else bytes(x)) for k, x in value.items()))
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def every_row(spark: Any, path: str) -> list[tuple]:
    """Every row of the Delta table at ``path``, every column in name order (sorted; a duplicate
    row counts)."""
    frame = spark.read.format("delta").load(path)
    names = sorted(frame.columns)
    return sorted((tuple(_plain(r[n]) for n in names) for r in frame.toLocalIterator()), key=repr)
