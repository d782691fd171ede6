"""The compiled ZonedTimestamp kernel (``_pgcopy.zoned_iso``) gives the string kernels' result."""

from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_cdc.sources.postgres import copyread
from airflow_cdc.sources.postgres.types_temporal import _zoned_timestamp

pytestmark = pytest.mark.skipif(copyread._zoned_iso is None, reason="_pgcopy not built with zoned_iso")

VALUES = [
    "2024-01-01 00:00:00+00",
    "2024-01-01 00:00:00.5+00",
    "2024-01-01 00:00:00.12+00",
    "2024-01-01 00:00:00.123456+00",
    "2024-01-01 00:00:00.000001+00",
    "1999-12-31 23:59:59.999999+00",
    "0001-01-01 00:00:00+00",
    "9999-12-31 23:59:59.999999+00",
    None,
    "infinity",
    "-infinity",
    "0044-03-15 12:00:00+00 BC",
    "12345-01-01 00:00:00+00",
    "2024-06-01 10:00:00+02",
]
#: not the text output of a timestamptz: both paths must refuse them alike (the fast one leaves
#: them to the row-by-row path, which raises)
MALFORMED = [
    "2024-01-01 00:00:00.1234567+00",
    "2024-01-01 00:00:00.+00",
    "2024-01-01T00:00:00+00",
    "2024-0a-01 00:00:00+00",
    "2024-01-01 00:00:00+0",
    "",
]


def _both(text: pa.Array, precision: int, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object]:
    convert = _zoned_timestamp(precision)
    out = []
    for mode in ("", "python"):
        monkeypatch.setenv(copyread.COPY_ENV, mode)
        try:
            out.append(convert(text))
        except ValueError as e:
            out.append(type(e))
    return out[0], out[1]


@pytest.mark.parametrize("precision", [0, 1, 3, 5, 6, 7])
def test_compiled_equals_string_kernels(precision, monkeypatch):
    text = pa.array(VALUES * 3, pa.string())
    for part in (text, text.slice(5), text.slice(3, 9), text.slice(8, 1), text.slice(0, 0)):
        compiled, kernels = _both(part, precision, monkeypatch)
        assert isinstance(compiled, pa.Array) and compiled.equals(kernels), (precision, part)


def test_compiled_output_shape():
    text = pa.array(["2024-01-01 00:00:00+00", "2024-01-01 00:00:00.5+00", None, "infinity"])
    assert copyread.zoned_iso(text, 3).to_pylist() == [
        "2024-01-01T00:00:00.000Z",
        "2024-01-01T00:00:00.500Z",
        None,
        None,  # not the common shape: the row-by-row path converts it
    ]
    assert copyread.zoned_iso(text, 0).to_pylist()[:2] == ["2024-01-01T00:00:00Z"] * 2


@pytest.mark.parametrize("value", MALFORMED)
def test_malformed_values_are_refused_alike(value, monkeypatch):
    compiled, kernels = _both(pa.array([value], pa.string()), 6, monkeypatch)
    assert compiled is ValueError and kernels is ValueError


def test_python_setting_turns_the_kernel_off(monkeypatch):
    monkeypatch.setenv(copyread.COPY_ENV, "python")
    assert copyread.zoned_iso(pa.array(["2024-01-01 00:00:00+00"]), 6) is None
