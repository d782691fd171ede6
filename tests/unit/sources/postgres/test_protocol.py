"""Unit tests for the pgoutput (protocol version 1) decoder, against hand-built byte fixtures."""

from __future__ import annotations

import dataclasses
import pickle
import random
import struct
from datetime import UTC, datetime

import pytest

from airflow_cdc.core.errors import ProtocolError
from airflow_cdc.sources.postgres.protocol import (
    UNCHANGED_TOAST,
    Begin,
    BinaryValue,
    Commit,
    Delete,
    Insert,
    Message,
    Origin,
    Relation,
    RelationColumn,
    Truncate,
    TypeMessage,
    Update,
    decode,
    lsn_to_str,
    parse_tuple,
    str_to_lsn,
)

PG_EPOCH_US = 946_684_800_000_000


# --- fixture builders -----------------------------------------------------------------------


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def text_col(value: bytes) -> bytes:
    return b"t" + struct.pack(">I", len(value)) + value


def bin_col(value: bytes) -> bytes:
    return b"b" + struct.pack(">I", len(value)) + value


NULL = b"n"
TOAST = b"u"


def tupledata(*cols: bytes) -> bytes:
    return struct.pack(">H", len(cols)) + b"".join(cols)


def begin_msg(final_lsn: int, pg_ts: int, xid: int) -> bytes:
    return b"B" + struct.pack(">QqI", final_lsn, pg_ts, xid)


def commit_msg(flags: int, commit_lsn: int, end_lsn: int, pg_ts: int) -> bytes:
    return b"C" + struct.pack(">BQQq", flags, commit_lsn, end_lsn, pg_ts)


def relation_msg(relid: int, namespace: str, name: str, ident: bytes, cols: list[tuple]) -> bytes:
    out = b"R" + struct.pack(">I", relid) + cstr(namespace) + cstr(name) + ident
    out += struct.pack(">H", len(cols))
    for flags, col_name, oid, typmod in cols:
        out += struct.pack(">B", flags) + cstr(col_name) + struct.pack(">Ii", oid, typmod)
    return out


def insert_msg(relid: int, *cols: bytes) -> bytes:
    return b"I" + struct.pack(">I", relid) + b"N" + tupledata(*cols)


def message_msg(flags: int, lsn: int, prefix: str, content: bytes) -> bytes:
    return b"M" + struct.pack(">BQ", flags, lsn) + cstr(prefix) + struct.pack(">I", len(content)) + content


def truncate_msg(options: int, *relids: int) -> bytes:
    return b"T" + struct.pack(">IB", len(relids), options) + b"".join(struct.pack(">I", r) for r in relids)


SIX_COLS = (
    text_col(b"42"),
    text_col(b"hello world"),
    NULL,
    text_col(b"2024-01-01 00:00:00+00"),
    bin_col(b"\x00\x01\x02"),
    TOAST,
)
SIX_VALUES = (
    b"42",
    b"hello world",
    None,
    b"2024-01-01 00:00:00+00",
    BinaryValue(b"\x00\x01\x02"),
    UNCHANGED_TOAST,
)
RELATION_COLS = [(1, "id", 23, -1), (0, "name", 1043, 68), (0, "créé", 1184, -1)]

VALID_MESSAGES = {
    "begin": begin_msg(0x16_B374D848, 0, 7),
    "commit": commit_msg(0, 1, 2, 3),
    "origin": b"O" + struct.pack(">Q", 99) + cstr("node_a"),
    "relation": relation_msg(16384, "public", "users", b"d", RELATION_COLS),
    "type": b"Y" + struct.pack(">I", 70000) + cstr("public") + cstr("mood"),
    "insert": insert_msg(16384, *SIX_COLS),
    "update_plain": b"U" + struct.pack(">I", 1) + b"N" + tupledata(text_col(b"1")),
    "update_key": (
        b"U" + struct.pack(">I", 1) + b"K" + tupledata(text_col(b"1")) + b"N" + tupledata(text_col(b"2"))
    ),
    "delete": b"D" + struct.pack(">I", 1) + b"O" + tupledata(text_col(b"1"), NULL),
    "truncate": truncate_msg(3, 10, 11),
    "message": message_msg(1, 5, "app", b"payload"),
}


# --- transaction framing --------------------------------------------------------------------


def test_begin_converts_timestamp_to_unix_epoch() -> None:
    unix_us = int(datetime(2024, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000 + 123
    msg = decode(begin_msg(0x16_B374D848, unix_us - PG_EPOCH_US, 0xFFFFFFFF))
    assert msg == Begin(final_lsn=0x16_B374D848, commit_ts_us=unix_us, xid=0xFFFFFFFF)


def test_timestamp_zero_is_postgres_epoch_and_negative_is_before_it() -> None:
    assert decode(begin_msg(1, 0, 1)).commit_ts_us == PG_EPOCH_US
    assert decode(begin_msg(1, -PG_EPOCH_US, 1)).commit_ts_us == 0


def test_commit() -> None:
    msg = decode(commit_msg(0, 0xFFFFFFFF_FFFFFFFF, 0x1_00000000, 1_000_000))
    assert msg == Commit(flags=0, commit_lsn=2**64 - 1, end_lsn=2**32, commit_ts_us=PG_EPOCH_US + 1_000_000)


def test_origin() -> None:
    assert decode(VALID_MESSAGES["origin"]) == Origin(lsn=99, name="node_a")


# --- catalog messages -----------------------------------------------------------------------


def test_relation() -> None:
    msg = decode(VALID_MESSAGES["relation"])
    assert msg == Relation(
        relid=16384,
        namespace="public",
        name="users",
        replica_identity="d",
        columns=(
            RelationColumn(is_key=True, name="id", type_oid=23, typmod=-1),
            RelationColumn(is_key=False, name="name", type_oid=1043, typmod=68),
            RelationColumn(is_key=False, name="créé", type_oid=1184, typmod=-1),
        ),
    )


def test_relation_without_columns_and_pg_catalog_namespace() -> None:
    msg = decode(relation_msg(2**32 - 1, "", "t", b"f", []))
    assert msg == Relation(relid=2**32 - 1, namespace="", name="t", replica_identity="f", columns=())


def test_type() -> None:
    assert decode(VALID_MESSAGES["type"]) == TypeMessage(type_oid=70000, namespace="public", name="mood")


# --- row messages and tuple data ------------------------------------------------------------


def test_insert_with_every_tuple_kind() -> None:
    msg = decode(VALID_MESSAGES["insert"])
    assert msg == Insert(relid=16384, new=SIX_VALUES)
    assert type(msg.new) is tuple
    assert type(msg.new[0]) is bytes  # text format stays raw bytes, not str
    assert type(msg.new[4]) is BinaryValue and isinstance(msg.new[4], bytes)
    assert msg.new[5] is UNCHANGED_TOAST


def test_insert_empty_text_value_and_zero_columns() -> None:
    assert decode(insert_msg(5, text_col(b""))).new == (b"",)
    assert decode(insert_msg(5)).new == ()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (insert_msg(5, text_col(b"x")), Insert(5, (b"x",))),
        (VALID_MESSAGES["update_key"], Update(1, "K", (b"1",), (b"2",))),
        (VALID_MESSAGES["delete"], Delete(1, "O", (b"1", None))),
        (begin_msg(1, 2, 3), Begin(1, 2 + PG_EPOCH_US, 3)),
        (commit_msg(0, 1, 2, 3), Commit(0, 1, 2, 3 + PG_EPOCH_US)),
    ],
)
def test_decoded_messages_are_ordinary_frozen_dataclasses(data: bytes, expected: object) -> None:
    msg = decode(data)
    assert type(msg) is type(expected)
    assert msg == expected and hash(msg) == hash(expected) and repr(msg) == repr(expected)
    first_field = dataclasses.fields(msg)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(msg, first_field, 6)
    assert pickle.loads(pickle.dumps(msg)) == msg


def test_update_without_old_tuple() -> None:
    assert decode(VALID_MESSAGES["update_plain"]) == Update(relid=1, old_kind=None, old=None, new=(b"1",))


@pytest.mark.parametrize("kind", ["K", "O"])
def test_update_with_old_tuple(kind: str) -> None:
    data = (
        b"U"
        + struct.pack(">I", 77)
        + kind.encode()
        + tupledata(text_col(b"1"), NULL if kind == "K" else text_col(b"old"))
        + b"N"
        + tupledata(text_col(b"1"), TOAST)
    )
    expected_old = (b"1", None) if kind == "K" else (b"1", b"old")
    assert decode(data) == Update(relid=77, old_kind=kind, old=expected_old, new=(b"1", UNCHANGED_TOAST))


@pytest.mark.parametrize("kind", ["K", "O"])
def test_delete(kind: str) -> None:
    data = b"D" + struct.pack(">I", 9) + kind.encode() + tupledata(text_col(b"7"), NULL)
    assert decode(data) == Delete(relid=9, old_kind=kind, old=(b"7", None))


def test_parse_tuple_at_offset_returns_next_offset() -> None:
    buf = b"junk" + tupledata(text_col(b"ab"), NULL, TOAST, bin_col(b"\xff")) + b"rest"
    values, end = parse_tuple(buf, 4)
    assert values == (b"ab", None, UNCHANGED_TOAST, BinaryValue(b"\xff"))
    assert buf[end:] == b"rest"


def test_decode_accepts_memoryview_and_bytearray() -> None:
    data = VALID_MESSAGES["insert"]
    assert decode(memoryview(data)) == decode(bytearray(data)) == decode(data)
    assert type(decode(memoryview(data)).new[0]) is bytes


def test_unchanged_toast_sentinel_survives_pickle_and_copy() -> None:
    assert repr(UNCHANGED_TOAST) == "UNCHANGED_TOAST"
    assert pickle.loads(pickle.dumps(UNCHANGED_TOAST)) is UNCHANGED_TOAST
    assert repr(BinaryValue(b"a")) == "BinaryValue(b'a')"


# --- truncate and logical decoding messages -------------------------------------------------


@pytest.mark.parametrize(
    ("options", "cascade", "restart"),
    [(0, False, False), (1, True, False), (2, False, True), (3, True, True)],
)
def test_truncate_options(options: int, cascade: bool, restart: bool) -> None:
    msg = decode(truncate_msg(options, 16384, 16390, 2**32 - 1))
    assert msg == Truncate(relids=(16384, 16390, 2**32 - 1), cascade=cascade, restart_identity=restart)


@pytest.mark.parametrize("flags", [0, 1])
def test_message(flags: int) -> None:
    msg = decode(message_msg(flags, 0xABCDEF, "my.prefix", b"bin\x00ary"))
    assert msg == Message(transactional=bool(flags), lsn=0xABCDEF, prefix="my.prefix", content=b"bin\x00ary")
    assert type(msg.content) is bytes


def test_message_with_empty_content() -> None:
    assert decode(message_msg(0, 1, "", b"")) == Message(transactional=False, lsn=1, prefix="", content=b"")


# --- malformed input ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALID_MESSAGES))
def test_truncated_at_every_offset_raises_protocol_error(name: str) -> None:
    data = VALID_MESSAGES[name]
    decode(data)  # the full message is valid
    for cut in range(len(data)):
        with pytest.raises(ProtocolError, match="byte offset"):
            decode(data[:cut])


@pytest.mark.parametrize("name", sorted(VALID_MESSAGES))
def test_trailing_garbage_raises_protocol_error(name: str) -> None:
    data = VALID_MESSAGES[name]
    with pytest.raises(ProtocolError, match=f"unexpected trailing bytes at byte offset {len(data)}"):
        decode(data + b"\x00")


def test_error_names_message_type_and_offset() -> None:
    data = VALID_MESSAGES["insert"]
    expected = r"Insert \('I'\) message: tuple data: truncated at byte offset 8"
    with pytest.raises(ProtocolError, match=expected):
        decode(data[:8])
    with pytest.raises(ProtocolError, match=r"Relation \('R'\) message: .*byte offset"):
        decode(VALID_MESSAGES["relation"][:20])


@pytest.mark.parametrize("data", [b"Z\x00\x00", b"S" + b"\x00" * 8, b"\x00", b"\xff"])
def test_unknown_message_type(data: bytes) -> None:
    with pytest.raises(ProtocolError, match="unknown logical replication message type .* at byte offset 0"):
        decode(data)


def test_empty_message() -> None:
    with pytest.raises(ProtocolError, match="empty"):
        decode(b"")


def test_unknown_tuple_kind() -> None:
    data = insert_msg(1, text_col(b"a"), b"x")
    with pytest.raises(ProtocolError, match=r"unknown column kind 'x' at byte offset 14"):
        decode(data)
    with pytest.raises(ProtocolError, match="unknown column kind 0x00 at byte offset 2"):
        parse_tuple(tupledata(b"\x00"), 0)


def test_value_length_overrunning_buffer() -> None:
    data = b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">H", 1) + b"t" + struct.pack(">I", 100) + b"abc"
    with pytest.raises(ProtocolError, match="column 0 value of 100 bytes overruns buffer at byte offset 8"):
        decode(data)
    huge = b"I" + struct.pack(">I", 1) + b"N" + struct.pack(">H", 1) + b"b" + struct.pack(">I", 2**32 - 1)
    with pytest.raises(ProtocolError):
        decode(huge)


def test_bad_utf8_in_relation_name() -> None:
    data = b"R" + struct.pack(">I", 1) + cstr("public") + b"us\xffers\0" + b"d" + struct.pack(">H", 0)
    with pytest.raises(ProtocolError, match="not valid UTF-8.* at byte offset 14"):
        decode(data)


@pytest.mark.parametrize(
    "data",
    [
        b"I" + struct.pack(">I", 1) + b"K" + tupledata(),  # insert needs 'N'
        b"U" + struct.pack(">I", 1) + b"X" + tupledata(),
        b"U" + struct.pack(">I", 1) + b"O" + tupledata() + b"O" + tupledata(),
        b"D" + struct.pack(">I", 1) + b"N" + tupledata(),  # delete needs 'K' or 'O'
    ],
)
def test_bad_tuple_markers(data: bytes) -> None:
    with pytest.raises(ProtocolError, match="expected"):
        decode(data)


def test_truncate_with_absurd_relation_count() -> None:
    with pytest.raises(ProtocolError, match="truncated"):
        decode(b"T" + struct.pack(">IB", 2**32 - 1, 0) + struct.pack(">I", 1))


def test_random_corruption_never_escapes_as_other_exceptions() -> None:
    rng = random.Random(20240101)
    fixtures = list(VALID_MESSAGES.values())
    for _ in range(5000):
        data = bytearray(rng.choice(fixtures))
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            decode(bytes(data))
        except ProtocolError:
            pass


# --- LSN helpers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0/0", 0),
        ("FFFFFFFF/FFFFFFFF", 2**64 - 1),
        ("16/B374D848", 0x16_B374D848),
        ("1/0", 2**32),
        ("0/1", 1),
    ],
)
def test_lsn_round_trip(text: str, value: int) -> None:
    assert str_to_lsn(text) == value
    assert lsn_to_str(value) == text


def test_str_to_lsn_accepts_lowercase_and_leading_zeros() -> None:
    assert str_to_lsn("16/b374d848") == 0x16_B374D848
    assert str_to_lsn("00000016/0B374D84") == 0x16_0B374D84
    assert lsn_to_str(0x16_0B374D84) == "16/B374D84"


@pytest.mark.parametrize(
    "text",
    ["", "0", "0/", "/0", "123456789/0", "0/123456789", "G/0", " 0/0", "0/0 ", "0/0\n", "+1/0", "-1/0"]
    + ["1//0", "0x1/0", "1/0/0"],
)
def test_str_to_lsn_rejects_bad_input(text: str) -> None:
    with pytest.raises(ValueError):
        str_to_lsn(text)


@pytest.mark.parametrize("value", [-1, 2**64, True, 1.0, "0/0", None])
def test_lsn_to_str_rejects_bad_input(value: object) -> None:
    with pytest.raises(ValueError):
        lsn_to_str(value)  # type: ignore[arg-type]


def test_str_to_lsn_rejects_non_string() -> None:
    with pytest.raises(ValueError):
        str_to_lsn(0)  # type: ignore[arg-type]
