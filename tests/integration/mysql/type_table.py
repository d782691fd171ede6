"""One table of (MySQL type, declared options, edge values, charset) -> Debezium's value, and the
test generated from it: every case becomes a column of one table, read through the snapshot
(chunks, and parts), the binlog stream, and the stream after an ``ALTER TABLE`` that adds the
column or changes and renames a placeholder into it.  Shared by the MariaDB suite (``make test``)
and the MySQL 8 suite (``AIRFLOW_CDC_MYSQL8_URL``).

Expected values follow Debezium's MySQL type mapping (the seeds' "数据类型映射" tables and
``MySqlValueConverters``) in the default modes: ``decimal.handling.mode=precise``,
``time.precision.mode=adaptive_time_microseconds``, ``bigint.unsigned.handling.mode=long``,
``binary.handling.mode=bytes``, ``enable.time.adjuster=true``.
"""

from __future__ import annotations

import datetime as dt
import struct
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from airflow_cdc.core import snapshot_parts
from airflow_cdc.core.batch import Batch
from airflow_cdc.core.pipeline import build_capture
from tests.integration.mysql.support import pipeline, run_capture
from tests.support.snapshot_parts import prepare

_EPOCH = dt.datetime(1970, 1, 1)
_DBZ, _KAFKA, _DATA = "io.debezium.time.", "org.apache.kafka.connect.data.", "io.debezium.data."
SNAPSHOT, STREAM, AFTER_DDL = "snapshot", "stream", "after_ddl"


def days(text: str) -> int:
    """io.debezium.time.Date: days since the epoch (proleptic Gregorian, also before 1582)."""
    return (dt.date.fromisoformat(text) - _EPOCH.date()).days


def micros(text: str) -> int:
    return (dt.datetime.fromisoformat(text) - _EPOCH) // dt.timedelta(microseconds=1)


def millis(text: str) -> int:
    return micros(text) // 1000


def f32(x: float) -> float:
    """The float a FLOAT column stores for ``x`` (read as a Java float, widened to double)."""
    return float(struct.unpack("<f", struct.pack("<f", x))[0])


def point_wkb(x: float, y: float) -> bytes:
    return b"\x01\x01\x00\x00\x00" + struct.pack("<dd", x, y)


@dataclass(frozen=True)
class Case:
    """``sql_type`` as declared; ``values``: (SQL literal, expected Debezium value) pairs; ``schema``:
    (connect.type, connect.name); ``after_ddl``: expected values where a column declared by a DDL
    the connector read differs (BOOLEAN)."""

    sql_type: str
    values: tuple[tuple[str, Any], ...]
    schema: tuple[str, str | None]
    after_ddl: tuple[Any, ...] | None = None
    after_ddl_schema: tuple[str, str | None] | None = None
    nullable: bool = True


def _c(sql_type: str, schema: tuple[str, str | None], *values: tuple[str, Any], **kw: Any) -> Case:
    return Case(sql_type, tuple(values), schema, **kw)


_I16, _I32, _I64 = ("int16", None), ("int32", None), ("int64", None)
_BYTES, _STR = ("bytes", None), ("string", None)
_MAX_DEC = "9" * 35 + "." + "9" * 30

#: the generic type table (charsets are added by :func:`charset_cases`)
TYPE_CASES: list[Case] = [
    _c("tinyint", _I16, ("-128", -128), ("127", 127)),
    _c("tinyint unsigned", _I16, ("0", 0), ("255", 255)),
    _c("tinyint(1)", _I16, ("0", 0), ("1", 1)),
    # BOOLEAN is TINYINT(1): a table that existed before the capture reads as tinyint(1) (Debezium's
    # snapshot parses SHOW CREATE TABLE); a column a captured DDL declares BOOLEAN is a BOOLEAN
    _c("boolean", _I16, ("0", 0), ("1", 1), after_ddl=(False, True), after_ddl_schema=("boolean", None)),
    _c("smallint", _I16, ("-32768", -32768), ("32767", 32767)),
    _c("smallint unsigned", _I32, ("65535", 65535)),
    _c("mediumint", _I32, ("-8388608", -8388608), ("8388607", 8388607)),
    _c("mediumint unsigned", _I32, ("16777215", 16777215)),
    _c("int", _I32, ("-2147483648", -2147483648), ("2147483647", 2147483647)),
    _c("int unsigned", _I64, ("4294967295", 4294967295)),
    _c("bigint", _I64, ("-9223372036854775808", -(2**63)), ("9223372036854775807", 2**63 - 1)),
    # bigint.unsigned.handling.mode=long: the value as Java's long, wrapped
    _c("bigint unsigned", _I64, ("18446744073709551615", -1), ("9223372036854775807", 2**63 - 1)),
    _c("float", ("float32", None), ("-1.5", -1.5), ("3.4e38", f32(3.4e38)), ("1e-38", f32(1e-38))),
    # FLOAT(M,D) is FLOAT64 in Debezium's mapping: the stored float widened to double
    _c("float(7,3)", ("float64", None), ("1234.567", f32(1234.567)), ("-0.5", -0.5)),
    _c("double", ("float64", None), ("-1.7976931348623157e308", -1.7976931348623157e308),
       ("2.2250738585072014e-308", 2.2250738585072014e-308)),
    _c("decimal(10,2)", ("bytes", _KAFKA + "Decimal"), ("-99999999.99", Decimal("-99999999.99")),
       ("0.01", Decimal("0.01"))),
    # beyond 38 digits: Debezium's own encoding (unscaled two's complement bytes), see types._decimal
    _c("decimal(65,30)", ("bytes", _KAFKA + "Decimal"),
       (_MAX_DEC, int(_MAX_DEC.replace(".", "")).to_bytes(28, "big", signed=True))),
    _c("date", ("int32", _DBZ + "Date"), ("'1000-01-01'", days("1000-01-01")),
       ("'9999-12-31'", days("9999-12-31")), ("'1970-01-01'", 0),
       ("'0000-00-00'", None)),  # a zero date in an optional column is null (documented)
    # enable.time.adjuster: years 0-69 are 2000-2069, 70-99 are 1970-1999 (MySqlValueConverters.adjustTemporal)
    _c("date", ("int32", _DBZ + "Date"), ("'0001-01-01'", days("2001-01-01")),
       ("'0069-12-31'", days("2069-12-31")), ("'0070-01-01'", 0), ("'0099-12-31'", days("1999-12-31"))),
    # a zero date in a mandatory column is the epoch (documented; Debezium's snapshot gives the default)
    _c("date NOT NULL DEFAULT '2000-01-01'", ("int32", _DBZ + "Date"), ("'0000-00-00'", 0),
       ("'2000-02-29'", days("2000-02-29")), nullable=False),
    _c("datetime", ("int64", _DBZ + "Timestamp"), ("'1000-01-01 00:00:00'", millis("1000-01-01 00:00:00")),
       ("'9999-12-31 23:59:59'", millis("9999-12-31 23:59:59")), ("'0000-00-00 00:00:00'", None),
       ("'0050-06-01 12:00:00'", millis("2050-06-01 12:00:00"))),
    _c("datetime(3)", ("int64", _DBZ + "Timestamp"), ("'2018-06-20 15:13:16.945'", millis("2018-06-20 15:13:16.945"))),
    _c("datetime(6)", ("int64", _DBZ + "MicroTimestamp"),
       ("'9999-12-31 23:59:59.999999'", micros("9999-12-31 23:59:59.999999")),
       ("'1000-01-01 00:00:00.000001'", micros("1000-01-01 00:00:00.000001"))),
    # ZonedTimestamp in UTC with exactly the column's fractional digits (ZonedTimestamp.toIsoString)
    _c("timestamp NULL", ("string", _DBZ + "ZonedTimestamp"), ("'1970-01-01 00:00:01'", "1970-01-01T00:00:01Z"),
       ("'2038-01-19 03:14:07'", "2038-01-19T03:14:07Z")),
    _c("timestamp(1) NULL", ("string", _DBZ + "ZonedTimestamp"),
       ("'2020-01-01 00:00:00.1'", "2020-01-01T00:00:00.1Z"), ("'2020-01-01 00:00:00'", "2020-01-01T00:00:00.0Z")),
    _c("timestamp(3) NULL", ("string", _DBZ + "ZonedTimestamp"),
       ("'2020-01-01 00:00:00.12'", "2020-01-01T00:00:00.120Z")),
    _c("timestamp(6) NULL", ("string", _DBZ + "ZonedTimestamp"),
       ("'2038-01-19 03:14:07.999999'", "2038-01-19T03:14:07.999999Z"),
       ("'2020-01-01 00:00:00.1'", "2020-01-01T00:00:00.100000Z")),
    # a zero TIMESTAMP in a mandatory column is the epoch (documented)
    _c("timestamp NOT NULL DEFAULT '2000-01-01 00:00:00'", ("string", _DBZ + "ZonedTimestamp"),
       ("'0000-00-00 00:00:00'", "1970-01-01T00:00:00Z"), nullable=False),
    _c("time", ("int64", _DBZ + "MicroTime"), ("'-838:59:59'", -3020399000000), ("'838:59:59'", 3020399000000)),
    _c("time(6)", ("int64", _DBZ + "MicroTime"), ("'-838:59:59.000000'", -3020399000000),
       ("'00:00:00.000001'", 1), ("'12:34:56.5'", 45296500000)),
    # YEAR 0000 is MySQL's zero year, not a two-digit year: 0 (Debezium's binlog path adjusts it to 2000)
    _c("year", ("int32", _DBZ + "Year"), ("1901", 1901), ("2155", 2155), ("0000", 0)),
    _c("bit(1)", ("boolean", None), ("b'0'", False), ("b'1'", True)),
    _c("bit(10)", ("bytes", _DATA + "Bits"), ("b'1010101010'", b"\xaa\x02")),
    _c("bit(64)", ("bytes", _DATA + "Bits"), ("b'" + "1" * 64 + "'", b"\xff" * 8)),
    _c("binary(4)", _BYTES, ("x'01'", b"\x01\x00\x00\x00"), ("x'ffffffff'", b"\xff" * 4)),
    _c("varbinary(10)", _BYTES, ("x''", b""), ("x'00ff00'", b"\x00\xff\x00")),
    _c("tinyblob", _BYTES, ("x'00'", b"\x00")),
    _c("blob", _BYTES, ("x'0102'", b"\x01\x02")),
    _c("mediumblob", _BYTES, ("x'ff'", b"\xff")),
    _c("longblob", _BYTES, ("x'00ff'", b"\x00\xff")),
    _c("tinytext", _STR, ("'t😀'", "t😀")),
    _c("mediumtext", _STR, ("''", "")),
    _c("longtext", _STR, ("'long'", "long")),
    _c("json", ("string", _DATA + "Json"), ("'[1]'", "[1]"), ("'\"a\"'", '"a"')),
    # POINT is io.debezium.data.geometry.Point {x, y, wkb, srid}; an SRID of 0 is null
    _c("point", ("struct", _DATA + "geometry.Point"),
       ("ST_GeomFromText('POINT(1.5 -2.25)', 3857)",
        {"x": 1.5, "y": -2.25, "wkb": point_wkb(1.5, -2.25), "srid": 3857}),
       ("ST_GeomFromText('POINT(0 0)')", {"x": 0.0, "y": 0.0, "wkb": point_wkb(0, 0), "srid": None})),
    _c("linestring", ("struct", _DATA + "geometry.Geometry"),
       ("ST_GeomFromText('LINESTRING(0 0, 1 1)')",
        {"wkb": b"\x01\x02\x00\x00\x00\x02\x00\x00\x00" + struct.pack("<4d", 0, 0, 1, 1), "srid": None})),
]

#: text with characters outside ASCII, from which each charset's sample takes what it can encode
_POOL = "😀é€Žжñßα日本中한กאعāşÆԱა"


def server_samples(conn: Any) -> dict[str, str]:
    """A sample text per character set the server offers (all but ``binary``): ASCII plus up to
    three characters of :data:`_POOL` that the server converts to the character set and back
    unchanged -- the server is the oracle (e.g. MySQL's ``greek`` has no euro sign)."""
    with conn.cursor() as cur:
        cur.execute("SELECT CHARACTER_SET_NAME FROM information_schema.CHARACTER_SETS")
        names = sorted({str(r[0]) for r in cur.fetchall()} - {"binary", "utf8"})
        samples = {}
        for cs in names:
            back = ", ".join(f"CONVERT(CONVERT(%s USING {cs}) USING utf8mb4) = %s COLLATE utf8mb4_bin" for _ in _POOL)
            cur.execute("SELECT " + back, [x for ch in _POOL for x in (ch, ch)])
            kept = [ch for ch, same in zip(_POOL, cur.fetchone(), strict=True) if same]
            samples[cs] = "a" + "".join(kept[:3])
    return samples


def charset_cases(samples: dict[str, str]) -> list[Case]:
    """CHAR, VARCHAR, TEXT, ENUM and SET in each character set of :func:`server_samples`."""
    cases = []
    for cs, s in sorted(samples.items()):
        # the server keeps ENUM/SET labels in utf8mb3 (the table definition): no characters
        # beyond the BMP in labels, whatever the column's character set
        label = "".join(ch for ch in s if ord(ch) < 0x10000)
        lit, label_lit = f"'{s}'", f"'{label}'"
        cases += [
            _c(f"char(8) CHARACTER SET {cs}", _STR, (lit, s)),
            _c(f"varchar(8) CHARACTER SET {cs}", _STR, (lit, s), ("''", "")),
            _c(f"text CHARACTER SET {cs}", _STR, (lit, s)),
            _c(f"enum('x',{label_lit}) CHARACTER SET {cs}", ("string", _DATA + "Enum"), (label_lit, label),
               ("'x'", "x")),
            _c(f"set('x',{label_lit}) CHARACTER SET {cs}", ("string", _DATA + "EnumSet"),
               (f"'x,{label}'", f"x,{label}")),
        ]
    return cases


def writer(db: Any, *statements: str) -> None:
    """Run statements in a session that accepts zero dates, with UTC timestamps."""
    conn = db.connect(autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("SET SESSION sql_mode = '', time_zone = '+00:00'")
            for s in statements:
                cur.execute(s)
    finally:
        conn.close()


def _rows(cases: list[Case], first_id: int) -> tuple[list[str], list[list[Any]]]:
    """INSERT value lists and expected values per row: each case's values in turn (its first value
    again when it has fewer), then a row of NULLs (first values in mandatory columns)."""
    n = max(len(c.values) for c in cases)
    sql, expected = [], []
    for r in range(n):
        picked = [c.values[r] if r < len(c.values) else c.values[0] for c in cases]
        sql.append(f"({first_id + r}, " + ", ".join(p[0] for p in picked) + ")")
        expected.append([p[1] for p in picked])
    sql.append(f"({first_id + n}, " + ", ".join("NULL" if c.nullable else c.values[0][0] for c in cases) + ")")
    expected.append([None if c.nullable else c.values[0][1] for c in cases])
    return sql, expected


def _after_ddl(case: Case, r: int, value: Any) -> Any:
    if case.after_ddl is None or value is None:
        return value
    return case.after_ddl[r] if r < len(case.after_ddl) else case.after_ddl[0]


def _events(batch_path: Any, table: str) -> tuple[list[dict], dict[str, dict]]:
    batch = Batch(batch_path)
    if table not in batch.tables():
        return [], {}
    events = [row for rb in batch.iter_events(table) for row in rb.to_pylist()]
    after = pq.read_schema(batch.parts(table)[0]).field("after").type
    meta = {after.field(i).name: after.field(i).metadata or {} for i in range(after.num_fields)}
    return events, meta


class TypeTable:
    """The generated test on one database (``connector``: ``mariadb`` or ``mysql``)."""

    def __init__(self, db: Any, connector: str, execute: Any = writer) -> None:
        self.db, self.execute, self.connector = db, execute, connector
        conn = db.connect()
        try:
            samples = server_samples(conn)
        finally:
            conn.close()
        generic = TYPE_CASES
        if connector == "mariadb":
            # MariaDB's JSON is LONGTEXT with a json_valid CHECK: a plain string, as Debezium's
            # MariaDB connector reads it
            generic = [replace(c, schema=_STR) if c.sql_type == "json" else c for c in generic]
        self.cases = generic + charset_cases(samples)
        self.cols = [f"c{i}" for i in range(len(self.cases))]

    def _ddl(self, table: str) -> str:
        cols = ", ".join(f"{n} {c.sql_type}" for n, c in zip(self.cols, self.cases, strict=True))
        return f"CREATE TABLE {table} (id int PRIMARY KEY, {cols})"

    def _insert(self, table: str, first_id: int) -> tuple[list[str], list[list[Any]]]:
        sql, expected = _rows(self.cases, first_id)
        self.execute(self.db, f"INSERT INTO {table} (id, {', '.join(self.cols)}) VALUES " + ", ".join(sql))
        return sql, expected

    def _alter(self) -> str:
        """Even cases are added, odd ones change (and rename) a placeholder ``o<i> int``."""
        parts = [
            f"ADD COLUMN {n} {c.sql_type}" if i % 2 == 0 else f"CHANGE COLUMN o{i} {n} {c.sql_type}"
            for i, (n, c) in enumerate(zip(self.cols, self.cases, strict=True))
        ]
        return "ALTER TABLE a " + ", ".join(parts)

    def run(self, staging: Path) -> dict[str, list[str]]:
        """Capture the table through every path; returns mismatches per path (empty: all equal)."""
        db = self.db.name
        placeholders = ", ".join(f"o{i} int" for i in range(1, len(self.cases), 2))
        self.execute(self.db, self._ddl("s"), f"CREATE TABLE a (id int PRIMARY KEY, {placeholders})")
        _, snap_expected = self._insert("s", 1)
        config = pipeline(self.db, staging / "main", connector=self.connector)
        snap_events, snap_meta = _events(run_capture(config).batch_path, f"{db}.s")
        # snapshot parts: a first run anchors the state and reads one row; parts read the rest
        parts = {"name": f"parts_{db}", "connector": self.connector, "table.include.list": f"{db}.s"}
        parts_config = pipeline(self.db, staging / "parts", **parts)
        first = run_capture({**parts_config, "snapshot.max.rows.per.run": 1, "incremental.snapshot.chunk.size": 1})
        plan = prepare(parts_config, 2)
        assert plan is not None, "no snapshot parts were planned"
        loaded: list[Any] = []
        real = snapshot_parts.load_parts

        def spy(*args: Any, **kwargs: Any) -> Any:
            loaded.append(real(*args, **kwargs))
            return loaded[-1]

        snapshot_parts.load_parts = spy  # type: ignore[assignment]
        try:
            result = build_capture(parts_config).run(commit=True, prepared=plan)
        finally:
            snapshot_parts.load_parts = real  # type: ignore[assignment]
        assert loaded and loaded[0] is not None, "the capture did not load the snapshot parts"
        parts_events, parts_meta = _events(result.batch_path, f"{db}.s")
        parts_events = _events(first.batch_path, f"{db}.s")[0] + parts_events
        _, stream_expected = self._insert("s", 1001)
        self.execute(self.db, self._alter())
        _, ddl_expected = self._insert("a", 2001)
        batch = run_capture(config).batch_path
        stream_events, stream_meta = _events(batch, f"{db}.s")
        ddl_events, ddl_meta = _events(batch, f"{db}.a")
        return {
            "snapshot chunks": self._check(snap_events, snap_meta, snap_expected, "r", SNAPSHOT),
            "snapshot parts": self._check(parts_events, parts_meta, snap_expected, "r", SNAPSHOT),
            "stream": self._check(stream_events, stream_meta, stream_expected, "c", STREAM),
            "after ALTER TABLE": self._check(ddl_events, ddl_meta, ddl_expected, "c", AFTER_DDL),
        }

    def _check(
        self, events: list[dict], meta: dict[str, dict], expected: list[list[Any]], op: str, phase: str
    ) -> list[str]:
        rows = sorted((e for e in events if e["op"] == op), key=lambda e: e["after"]["id"])
        if len(rows) != len(expected):
            return [f"{len(rows)} {op} events, expected {len(expected)}"]
        bad = []
        for i, case in enumerate(self.cases):
            name = self.cols[i]
            schema = case.after_ddl_schema if phase == AFTER_DDL and case.after_ddl_schema else case.schema
            m = meta.get(name, {})
            got_schema = (m.get(b"connect.type", b"").decode(), (m.get(b"connect.name") or b"").decode() or None)
            if got_schema != schema:
                bad.append(f"{case.sql_type}: schema {got_schema}, expected {schema}")
            for r, (event, want) in enumerate(zip(rows, expected, strict=True)):
                value = want[i] if phase != AFTER_DDL else _after_ddl(case, r, want[i])
                got = event["after"][name]
                if got != value or type(got) is not type(value):
                    bad.append(f"{case.sql_type} row {r}: {got!r}, expected {value!r}")
        return bad
