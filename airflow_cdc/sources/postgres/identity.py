"""``replica.identity.autoset.values``: the replica identity the connector sets on captured tables.

Debezium's format: comma-separated ``<regex of schema.table>:<identity>`` pairs, the identity one
of ``DEFAULT``, ``FULL``, ``NOTHING`` or ``INDEX <index name>``, e.g.
``schema1.*:FULL,schema2.table2:NOTHING,schema2.table3:INDEX idx_name``.  Only captured tables
are touched (others are ignored even when they match); the first matching pair wins.  At start-up
each matched table whose identity differs gets ``ALTER TABLE ... REPLICA IDENTITY ...``, which
needs the table's owner (or a member of its owning role).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg
from psycopg import errors as pgerr
from psycopg import sql

from airflow_cdc.core.errors import ConfigError, MissingPrivilege, ServerMisconfigured
from airflow_cdc.core.filters import TableId

log = logging.getLogger(__name__)

PROPERTY = "replica.identity.autoset.values"
#: a table's identity now: pg_class.relreplident and the identity index's name
_CURRENT = (
    "SELECT c.relreplident, (SELECT i.relname FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
    " WHERE x.indrelid = c.oid AND x.indisreplident) FROM pg_class c WHERE c.oid = %s"
)
#: pg_class.relreplident of each identity
_CODES = {"DEFAULT": "d", "FULL": "f", "NOTHING": "n", "INDEX": "i"}


@dataclass(frozen=True)
class Identity:
    kind: str  # DEFAULT | FULL | NOTHING | INDEX
    index: str | None = None

    def clause(self) -> sql.Composable:
        if self.kind == "INDEX":
            return sql.SQL("USING INDEX {}").format(sql.Identifier(self.index or ""))
        return sql.SQL(self.kind)

    def __str__(self) -> str:
        return f"INDEX {self.index}" if self.kind == "INDEX" else self.kind


def parse(value: str | None) -> list[tuple[re.Pattern[str], Identity]]:
    """The property's pairs, in order.

    :raises ConfigError: a pair without ``:``, a bad regex, or an unknown identity.
    """
    pairs: list[tuple[re.Pattern[str], Identity]] = []
    for item in (value or "").split(","):
        if not item.strip():
            continue
        pattern, sep, ident = item.strip().rpartition(":")
        if not sep or not pattern.strip():
            raise ConfigError(f"property '{PROPERTY}': {item.strip()!r} is not '<table regex>:<identity>'")
        words = ident.split()
        kind = words[0].upper() if words else ""
        if kind not in _CODES or (kind == "INDEX") != (len(words) == 2) or len(words) > 2:
            raise ConfigError(
                f"property '{PROPERTY}': {ident.strip()!r} for {pattern.strip()!r} is not one of DEFAULT, "
                "FULL, NOTHING, INDEX <index name>"
            )
        try:
            regex = re.compile(pattern.strip())
        except re.error as e:
            raise ConfigError(
                f"property '{PROPERTY}': {pattern.strip()!r} is not a regular expression: {e}"
            ) from e
        pairs.append((regex, Identity(kind, words[1] if kind == "INDEX" else None)))
    return pairs


def apply(conn: psycopg.Connection, value: str | None, tables: Iterable[tuple[TableId, int]]) -> list[str]:
    """Set the configured identity on each captured table that matches and differs; returns
    ``schema.table: IDENTITY`` for each table changed.  Repeating it changes nothing.

    :param tables: the captured tables and their OIDs.
    :raises ConfigError: an ``INDEX`` that the table does not have or cannot use.
    :raises MissingPrivilege: the user does not own a table it must change.
    """
    pairs = parse(value)
    changed: list[str] = []
    if not pairs:
        return changed
    for tid, oid in tables:
        wanted = next((ident for regex, ident in pairs if regex.fullmatch(f"{tid.schema}.{tid.table}")), None)
        if wanted is None:
            continue
        row = conn.execute(_CURRENT, (oid,)).fetchone()
        assert row is not None
        if row[0] == _CODES[wanted.kind] and (wanted.kind != "INDEX" or row[1] == wanted.index):
            continue
        statement = sql.SQL("ALTER TABLE {}.{} REPLICA IDENTITY {}").format(
            sql.Identifier(tid.schema), sql.Identifier(tid.table), wanted.clause()
        )
        try:
            with conn.transaction():
                conn.execute(statement)
        except pgerr.ReadOnlySqlTransaction as e:
            raise ServerMisconfigured(
                f"property '{PROPERTY}': cannot set REPLICA IDENTITY {wanted} on table {tid}: the server "
                "is a standby",
                hint=f"run {statement.as_string(conn)} on the primary (it replicates), or drop the property",
            ) from e
        except pgerr.InsufficientPrivilege as e:
            raise MissingPrivilege(
                f"property '{PROPERTY}': cannot set REPLICA IDENTITY {wanted} on table {tid}: "
                f"{e.diag.message_primary}",
                hint=f"run {statement.as_string(conn)} as the table's owner, or grant the owning role "
                "to the connector's user",
            ) from e
        except (pgerr.UndefinedObject, pgerr.WrongObjectType, pgerr.ObjectNotInPrerequisiteState,
                pgerr.InvalidTableDefinition, pgerr.FeatureNotSupported) as e:  # fmt: skip
            raise ConfigError(
                f"property '{PROPERTY}': cannot set REPLICA IDENTITY {wanted} on table {tid}: "
                f"{e.diag.message_primary}"
            ) from e
        log.info("set REPLICA IDENTITY %s on table %s (%s)", wanted, tid, PROPERTY)
        changed.append(f"{tid}: {wanted}")
    return changed
