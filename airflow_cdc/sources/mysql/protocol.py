"""Binlog event framing and the non-row events (MySQL ``libbinlogevents``, MariaDB ``log_event.h``).

Each network packet of a binlog dump is ``0x00`` + one event: a 19-byte common header
(``timestamp u32, type u8, server_id u32, event_size u32, log_pos u32, flags u16``), the event
body and, when the format description announces CRC32, a 4-byte checksum we strip.  ``log_pos``
is the position *after* the event, so an event starts at ``log_pos - event_size``.

Parsers never crash on malformed input: they raise :class:`ProtocolError` naming the event.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.sources.mysql import rowcodec as rc

# event types
QUERY, STOP, ROTATE, XID, TABLE_MAP, FORMAT_DESCRIPTION = 2, 3, 4, 16, 19, 15
HEARTBEAT, ROWS_QUERY, GTID, ANONYMOUS_GTID, PREVIOUS_GTIDS = 27, 29, 33, 34, 35
WRITE_V1, UPDATE_V1, DELETE_V1, WRITE_V2, UPDATE_V2, DELETE_V2 = 23, 24, 25, 30, 31, 32
PARTIAL_UPDATE, TRANSACTION_PAYLOAD = 39, 40
MARIA_ANNOTATE_ROWS, MARIA_BINLOG_CHECKPOINT, MARIA_GTID, MARIA_GTID_LIST = 160, 161, 162, 163
MARIA_START_ENCRYPTION = 164
MARIA_COMPRESSED = frozenset(range(165, 172))
ROWS_TYPES = {WRITE_V1: "c", UPDATE_V1: "u", DELETE_V1: "d", WRITE_V2: "c", UPDATE_V2: "u", DELETE_V2: "d"}
ROWS_V2 = frozenset({WRITE_V2, UPDATE_V2, DELETE_V2})
MARIA_FL_STANDALONE = 1

HEADER = struct.Struct("<IBIIIH")
HEADER_SIZE = HEADER.size  # 19
_U64 = struct.Struct("<Q").unpack_from
_U32 = struct.Struct("<I").unpack_from
_U16 = struct.Struct("<H").unpack_from


@dataclass(frozen=True, slots=True)
class Header:
    timestamp: int
    type: int
    server_id: int
    size: int
    log_pos: int
    flags: int

    @property
    def start(self) -> int:
        return self.log_pos - self.size if self.log_pos else 0


def parse_header(data: bytes, offset: int = 0) -> Header:
    if len(data) - offset < HEADER_SIZE:
        raise ProtocolError(f"binlog event shorter than its header ({len(data) - offset} bytes)")
    return Header(*HEADER.unpack_from(data, offset))


def lenenc(data: bytes, o: int) -> tuple[int, int]:
    """Read a length-encoded integer; returns (value, next offset)."""
    first = data[o]
    if first < 0xFB:
        return first, o + 1
    if first == 0xFC:
        return data[o + 1] | data[o + 2] << 8, o + 3
    if first == 0xFD:
        return int.from_bytes(data[o + 1 : o + 4], "little"), o + 4
    if first == 0xFE:
        return _U64(data, o + 1)[0], o + 9
    raise ProtocolError(f"invalid length-encoded integer prefix 0x{first:02x}")


def format_description_checksum(body: bytes) -> bool:
    """Whether events carry a CRC32 trailer, from a FORMAT_DESCRIPTION body (with its own trailer).

    The body ends with ``checksum_alg u8`` + 4 checksum bytes when the server knows checksums.
    """
    if len(body) < 2 + 50 + 4 + 1 + 5:
        return False
    return body[-5] == 1


@dataclass(frozen=True, slots=True)
class Rotate:
    next_file: str
    position: int


def parse_rotate(body: bytes) -> Rotate:
    if len(body) < 8:
        raise ProtocolError("ROTATE event too short")
    return Rotate(body[8:].decode("utf-8", "replace"), _U64(body, 0)[0])


@dataclass(frozen=True, slots=True)
class Query:
    thread_id: int
    schema: str
    query: str


def parse_query(body: bytes) -> Query:
    """QUERY_EVENT: ``thread_id u32, exec_time u32, db_len u8, error u16, status_len u16``."""
    try:
        thread_id, _, db_len, _, status_len = struct.unpack_from("<IIBHH", body, 0)
        o = 13 + status_len
        schema = body[o : o + db_len].decode("utf-8", "replace")
        text = body[o + db_len + 1 :].decode("utf-8", "replace")
    except (struct.error, IndexError) as e:
        raise ProtocolError(f"malformed QUERY event: {e}") from e
    return Query(thread_id, schema, text)


def parse_maria_gtid(body: bytes, server_id: int) -> tuple[str, bool]:
    """MariaDB GTID_EVENT: ``seq_no u64, domain_id u32, flags u8`` -> (``domain-server-seq``, standalone)."""
    if len(body) < 13:
        raise ProtocolError("MariaDB GTID event too short")
    seq, domain, flags = _U64(body, 0)[0], _U32(body, 8)[0], body[12]
    return f"{domain}-{server_id}-{seq}", bool(flags & MARIA_FL_STANDALONE)


def parse_mysql_gtid(body: bytes) -> str:
    """MySQL GTID_LOG_EVENT: ``flags u8, sid[16], gno u64`` -> ``uuid:gno``."""
    if len(body) < 25:
        raise ProtocolError("MySQL GTID event too short")
    sid = body[1:17].hex()
    uuid = f"{sid[:8]}-{sid[8:12]}-{sid[12:16]}-{sid[16:20]}-{sid[20:]}"
    return f"{uuid}:{_U64(body, 17)[0]}"


@dataclass
class TableMap:
    """A TABLE_MAP event: the layout of the rows events that follow for ``table_id``.

    Optional metadata (``binlog_row_metadata=FULL``) fills ``names``, ``unsigned``, ``enums``,
    ``sets``, ``charsets`` and ``primary_key``; without it those stay empty / None.
    """

    table_id: int
    schema: str
    table: str
    types: list[int]
    metas: list[int]
    nullable: list[bool]
    names: list[str] | None = None
    unsigned: list[bool] | None = None
    enums: list[list[str]] = field(default_factory=list)
    sets: list[list[str]] = field(default_factory=list)
    charsets: list[int | None] | None = None  # collation id per column (63 = binary)
    primary_key: list[int] | None = None
    geometry_types: list[int] = field(default_factory=list)
    #: ENUM / SET labels as logged (in the column's character set; ``enums``/``sets`` read them
    #: as UTF-8) and the collation of each ENUM/SET column, in column order
    enums_raw: list[list[bytes]] = field(default_factory=list)
    sets_raw: list[list[bytes]] = field(default_factory=list)
    enum_charsets: list[int | None] | None = None

    def signature(self) -> tuple:
        return (self.schema, self.table, tuple(self.types), tuple(self.metas))


def parse_table_map(body: bytes, geometry_charset: bool = False) -> TableMap:
    """Parse a TABLE_MAP body (post-header ``table_id u48, flags u16``).

    :param geometry_charset: the server counts GEOMETRY columns among the character columns of
        the charset metadata (MariaDB's ``is_character_type``: "Base class is blob for geom
        type"); MySQL does not.  Getting it wrong shifts every later column's character set.
    """
    try:
        table_id = int.from_bytes(body[0:6], "little")
        o = 8
        n = body[o]
        schema = body[o + 1 : o + 1 + n].decode("utf-8", "replace")
        o += 2 + n
        n = body[o]
        table = body[o + 1 : o + 1 + n].decode("utf-8", "replace")
        o += 2 + n
        ncols, o = lenenc(body, o)
        raw_types = list(body[o : o + ncols])
        o += ncols
        meta_len, o = lenenc(body, o)
        meta_end = o + meta_len
        types, metas = [], []
        for t in raw_types:
            size = rc.metadata_size(t)
            real, meta = rc.parse_metadata(t, body[o : o + size])
            types.append(real)
            metas.append(meta)
            o += size
        o = meta_end
        nbytes = (ncols + 7) // 8
        bits = int.from_bytes(body[o : o + nbytes], "little")
        o += nbytes
        tm = TableMap(table_id, schema, table, types, metas, [bool(bits >> i & 1) for i in range(ncols)])
        _optional_metadata(tm, body, o, geometry_charset)
    except (IndexError, struct.error) as e:
        raise ProtocolError(f"malformed TABLE_MAP event: {e}") from e
    return tm


def _strings(data: bytes, o: int, end: int) -> list[str]:
    out = []
    while o < end:
        n, o = lenenc(data, o)
        out.append(data[o : o + n].decode("utf-8", "replace"))
        o += n
    return out


def _byte_lists(data: bytes, o: int, end: int) -> list[list[bytes]]:
    out = []
    while o < end:
        count, o = lenenc(data, o)
        values = []
        for _ in range(count):
            n, o = lenenc(data, o)
            values.append(bytes(data[o : o + n]))
            o += n
        out.append(values)
    return out


def _utf8_lists(raw: list[list[bytes]]) -> list[list[str]]:
    return [[v.decode("utf-8", "replace") for v in values] for values in raw]


def _ints(data: bytes, o: int, end: int) -> list[int]:
    out = []
    while o < end:
        v, o = lenenc(data, o)
        out.append(v)
    return out


def enum_or_set(tm: TableMap, i: int) -> bool:
    """Whether column ``i`` is an ENUM or SET (``types`` holds the real type, see :func:`parse_metadata`)."""
    return tm.types[i] in (rc.T_ENUM, rc.T_SET)


def _optional_metadata(tm: TableMap, body: bytes, o: int, geometry_charset: bool = False) -> None:
    numeric = [i for i, t in enumerate(tm.types) if t in rc.NUMERIC_TYPES or t == rc.T_YEAR]
    character = rc.CHARACTER_TYPES | ({rc.T_GEOMETRY} if geometry_charset else set())
    text = [i for i, t in enumerate(tm.types) if t in character]
    labelled = [i for i in range(len(tm.types)) if enum_or_set(tm, i)]
    while o < len(body):
        kind = body[o]
        length, o = lenenc(body, o + 1)
        end = o + length
        if kind == 1:  # SIGNEDNESS: one bit per numeric column, most significant bit first
            bits = int.from_bytes(body[o:end], "big")
            width = length * 8
            tm.unsigned = [False] * len(tm.types)
            for k, i in enumerate(numeric):
                tm.unsigned[i] = bool(bits >> (width - 1 - k) & 1)
        elif kind == 3:  # COLUMN_CHARSET: one collation per character column
            tm.charsets = [None] * len(tm.types)
            for i, collation in zip(text, _ints(body, o, end), strict=False):
                tm.charsets[i] = collation
        elif kind == 2:  # DEFAULT_CHARSET: default, then (character column index, collation) pairs
            values = _ints(body, o, end)
            tm.charsets = [None] * len(tm.types)
            for i in text:
                tm.charsets[i] = values[0] if values else None
            for k in range(1, len(values) - 1, 2):
                if values[k] < len(text):
                    tm.charsets[text[values[k]]] = values[k + 1]
        elif kind == 4:
            tm.names = _strings(body, o, end)
        elif kind == 5:
            tm.sets_raw = _byte_lists(body, o, end)
            tm.sets = _utf8_lists(tm.sets_raw)
        elif kind == 6:
            tm.enums_raw = _byte_lists(body, o, end)
            tm.enums = _utf8_lists(tm.enums_raw)
        elif kind == 10:  # ENUM_AND_SET_DEFAULT_CHARSET: default, then (ENUM/SET index, collation) pairs
            values = _ints(body, o, end)
            tm.enum_charsets = [values[0] if values else None] * len(labelled)
            for k in range(1, len(values) - 1, 2):
                if values[k] < len(labelled):
                    tm.enum_charsets[values[k]] = values[k + 1]
        elif kind == 11:  # ENUM_AND_SET_COLUMN_CHARSET: one collation per ENUM/SET column
            tm.enum_charsets = [None] * len(labelled)
            for k, collation in enumerate(_ints(body, o, end)[: len(labelled)]):
                tm.enum_charsets[k] = collation
        elif kind == 7:
            tm.geometry_types = _ints(body, o, end)
        elif kind == 8:
            tm.primary_key = _ints(body, o, end)
        elif kind == 9:
            tm.primary_key = _ints(body, o, end)[0::2]
        o = end


def rows_body_start(event_type: int, body: bytes) -> tuple[int, int, int, list[bool], list[bool] | None]:
    """Parse a rows event's fixed part: (table_id, flags, offset of the first row, present
    columns of the before/only image, present columns of the after image for updates)."""
    try:
        table_id = int.from_bytes(body[0:6], "little")
        flags = _U16(body, 6)[0]
        o = 8
        if event_type in ROWS_V2:
            o += _U16(body, 8)[0]
        ncols, o = lenenc(body, o)
        nbytes = (ncols + 7) // 8
        bits = int.from_bytes(body[o : o + nbytes], "little")
        present = [bool(bits >> i & 1) for i in range(ncols)]
        o += nbytes
        after = None
        if ROWS_TYPES[event_type] == "u":
            bits = int.from_bytes(body[o : o + nbytes], "little")
            after = [bool(bits >> i & 1) for i in range(ncols)]
            o += nbytes
    except (IndexError, struct.error) as e:
        raise ProtocolError(f"malformed rows event: {e}") from e
    return table_id, flags, o, present, after
