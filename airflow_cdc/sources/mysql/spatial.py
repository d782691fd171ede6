"""Spatial values: MySQL's stored form (4-byte little-endian SRID, then WKB) -> Debezium's structs.

POINT columns are ``io.debezium.data.geometry.Point`` (``x``, ``y``, ``wkb``, ``srid``), every
other spatial type ``io.debezium.data.geometry.Geometry`` (``wkb``, ``srid``), as in Debezium's
MySQL type mapping; an SRID of 0 is null (MySqlGeometry.fromBytes).
"""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

GEOMETRY_TYPE = pa.struct([pa.field("wkb", pa.binary()), pa.field("srid", pa.int32())])
#: io.debezium.data.geometry.Point: x, y (FLOAT64) read from the WKB, then wkb and srid
POINT_TYPE = pa.struct(
    [
        pa.field("x", pa.float64()),
        pa.field("y", pa.float64()),
        pa.field("wkb", pa.binary()),
        pa.field("srid", pa.int32()),
    ]
)
SPATIAL = frozenset(
    {
        "geometry",
        "point",
        "linestring",
        "polygon",
        "multipoint",
        "multilinestring",
        "multipolygon",
        "geometrycollection",
        "geomcollection",
    }
)


def geometry(values: list) -> pa.Array:
    """io.debezium.data.geometry.Geometry: the WKB and the SRID (null for 0) of MySQL's value."""
    rows = [
        None if v is None else {"wkb": bytes(v[4:]), "srid": int.from_bytes(v[:4], "little") or None}
        for v in values
    ]
    return pa.array(rows, type=GEOMETRY_TYPE)


def point(values: list) -> pa.Array:
    """Debezium's Point.createValue: x and y parsed from the WKB (byte order byte, type, x, y)."""
    rows: list[dict[str, Any] | None] = []
    for v in values:
        if v is None:
            rows.append(None)
            continue
        wkb = bytes(v[4:])
        order = "<" if wkb[:1] == b"\x01" else ">"
        x, y = struct.unpack_from(order + "dd", wkb, 5) if len(wkb) >= 21 else (None, None)
        rows.append({"x": x, "y": y, "wkb": wkb, "srid": int.from_bytes(v[:4], "little") or None})
    return pa.array(rows, type=POINT_TYPE)
