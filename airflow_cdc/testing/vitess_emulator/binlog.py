"""A shard's binlog as whole transactions, decoded with our own binlog reader.

The dump (:class:`airflow_cdc.sources.mysql.client.BinlogStream`, started from a GTID), event
framing (:mod:`airflow_cdc.sources.mysql.protocol`) and row images
(:mod:`airflow_cdc.sources.mysql.rowcodec`) are the MySQL source's; this module only groups the
events into transactions and turns row images into Vitess text values
(:mod:`airflow_cdc.testing.vitess_emulator.values`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from airflow_cdc.sources.mysql import protocol as p
from airflow_cdc.sources.mysql import rowcodec as rc
from airflow_cdc.sources.mysql.client import BinlogStream
from airflow_cdc.testing.vitess_emulator.shard import JOURNAL_DB, JOURNAL_TABLE, EmulatedShard
from airflow_cdc.testing.vitess_emulator.values import BINARY_COLLATION, text_converter

_DDL_VERBS = ("CREATE", "ALTER", "DROP", "RENAME", "TRUNCATE")
Image = tuple  # one row as text bytes (None = NULL)


@dataclass
class RowsChange:
    """The rows of one binlog rows event of a keyspace table: (before, after) text images."""

    table: str
    signature: tuple
    changes: list[tuple[Image | None, Image | None]]
    names: list[str] = field(default_factory=list)  # the columns the row images have


@dataclass
class Transaction:
    """One committed binlog transaction of a shard.

    ``kind``: ``commit`` (rows, maybe none), ``ddl`` / ``other`` (a statement), ``journal`` (a
    row in the resharding journal: ``journal`` holds the serialized ``binlogdata.Journal``).
    """

    seq: int
    timestamp: int
    kind: str = "commit"
    statement: str = ""
    rows: list[RowsChange] = field(default_factory=list)
    journal: bytes | None = None


class _TableDecoder:
    def __init__(self, tm: p.TableMap) -> None:
        unsigned = tm.unsigned or [False] * len(tm.types)
        self.layout = [rc.ColumnLayout(t, m, u) for t, m, u in zip(tm.types, tm.metas, unsigned, strict=True)]
        enums, sets = iter(tm.enums), iter(tm.sets)
        charsets = tm.charsets or [None] * len(tm.types)
        self.convert: list[Callable[[Any], bytes]] = []
        for t, m, collation in zip(tm.types, tm.metas, charsets, strict=True):
            labels = next(enums, []) if t == rc.T_ENUM else next(sets, []) if t == rc.T_SET else []
            self.convert.append(text_converter(t, m, labels, binary=collation == BINARY_COLLATION))
        self.signature = tm.signature()
        self._readers: dict[tuple, Callable] = {}

    def images(self, etype: int, body: bytes) -> list[tuple[Image | None, Image | None]]:
        _, _, o, present, present_after = p.rows_body_start(etype, body)
        op = p.ROWS_TYPES[etype]
        first = self._reader(present)
        second = self._reader(present_after) if present_after is not None else None
        out: list[tuple[Image | None, Image | None]] = []
        while o < len(body):
            image, o = first(body, o)
            if second is not None:
                after, o = second(body, o)
                out.append((self._text(image), self._text(after)))
            elif op == "d":
                out.append((self._text(image), None))
            else:
                out.append((None, self._text(image)))
        return out

    def _reader(self, present: list[bool]) -> Callable:
        key = tuple(present)
        if key not in self._readers:
            self._readers[key] = rc.row_reader(self.layout, present)
        return self._readers[key]

    def _text(self, image: tuple) -> Image:
        return tuple(None if v is None else f(v) for v, f in zip(image, self.convert, strict=True))


class ShardBinlog:
    """Reads a shard's binlog after a transaction number, transaction by transaction."""

    def __init__(self, shard: EmulatedShard) -> None:
        self.shard = shard
        self._decoders: dict[tuple, _TableDecoder] = {}

    def transactions(self, after_seq: int) -> Iterator[Transaction]:
        """Transactions after ``after_seq`` up to the end of the binlog now (a non-blocking dump).

        :raises ProtocolError: the dump failed (see :func:`shard.is_purged_error`).
        """
        stream = self.shard.open_dump(after_seq)
        try:
            yield from self._read(stream)
        finally:
            stream.close()

    def _read(self, stream: BinlogStream) -> Iterator[Transaction]:
        maps: dict[int, tuple[p.TableMap, _TableDecoder | None]] = {}
        txn: Transaction | None = None
        standalone = False
        while (data := stream.read()) is not None:
            header = p.parse_header(data)
            body = data[p.HEADER_SIZE :]
            etype = header.type
            if etype == p.MARIA_GTID:
                gtid, standalone = p.parse_maria_gtid(body, header.server_id)
                txn = Transaction(int(gtid.rsplit("-", 1)[1]), header.timestamp)
            elif txn is None:
                continue
            elif etype == p.TABLE_MAP:
                tm = p.parse_table_map(body)
                maps[tm.table_id] = (tm, self._decoder(tm))
            elif etype in p.ROWS_TYPES:
                self._rows(txn, maps, etype, body)
            elif etype == p.XID:
                yield txn
                txn = None
            elif etype == p.QUERY:
                query = p.parse_query(body)
                text = query.query.strip()
                if text.upper() == "COMMIT":
                    yield txn
                    txn = None
                elif standalone:
                    txn.statement = text
                    txn.kind = self._statement_kind(query.schema, text)
                    yield txn
                    txn = None

    def _decoder(self, tm: p.TableMap) -> _TableDecoder | None:
        wanted = tm.schema == self.shard.database or (tm.schema, tm.table) == (JOURNAL_DB, JOURNAL_TABLE)
        if not wanted:
            return None
        key = tm.signature()
        if key not in self._decoders:
            self._decoders[key] = _TableDecoder(tm)
        return self._decoders[key]

    def _rows(self, txn: Transaction, maps: dict, etype: int, body: bytes) -> None:
        table_id = int.from_bytes(body[0:6], "little")
        tm, decoder = maps.get(table_id, (None, None))
        if decoder is None:
            return
        images = decoder.images(etype, body)
        if tm.schema == JOURNAL_DB:
            for _, after in images:
                if after is not None and after[1] == self.shard.database.encode():
                    txn.kind, txn.journal = "journal", after[2]
            return
        txn.rows.append(RowsChange(tm.table, decoder.signature, images, tm.names or []))

    def _statement_kind(self, schema: str, text: str) -> str:
        verb = text.split(None, 1)[0].upper() if text else ""
        if verb in _DDL_VERBS and schema == self.shard.database and "DATABASE" not in text.upper()[:40]:
            return "ddl"
        return "other"
