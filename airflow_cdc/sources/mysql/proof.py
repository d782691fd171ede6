"""Proof that the schema history versions a window relies on are the structures at their positions.

A version recorded at binlog coordinate ``c`` was read from information_schema when captured, and
the binlog head read right after is its ``read_at``.  It is the table's structure at ``c`` exactly
when no DDL on the table lies in ``(c, read_at)``: any DDL that ran before the read was logged
before ``read_at``.  :class:`VersionProof` remembers the versions a window relied on -- to decode
rows whose table map does not name its columns, for details only information_schema knows
(``tinyint(1)``), and to describe a schema change event -- and every DDL seen in the window, or
after it up to the largest ``read_at`` (:meth:`horizon`), is checked against them.  A version
disproved after rows were decoded with it stops the window: nothing was committed, no offset moved.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow_cdc.core.errors import SchemaError
from airflow_cdc.sources.mysql.schema import TableDef, Version

log = logging.getLogger(__name__)


@dataclass
class _Reliance:
    read_at: int
    rows_at: int | None = None  # first rows event decoded with the version (None: none)
    why: str = ""
    changes: list[tuple[list[dict[str, Any]], int]] = field(default_factory=list)  # tableChanges slots
    seen: TableDef | None = None  # the structure a full-metadata table map stated after the DDL


class VersionProof:
    """Versions relied on in one window, checked against the DDLs that follow them."""

    def __init__(self, where: Callable[[int], str]) -> None:
        """:param where: renders a coordinate as ``file:pos`` for messages."""
        self.where = where
        self._relied: dict[tuple[str, int], _Reliance] = {}

    def reset(self) -> None:
        """Start a window: the previous window's versions were checked up to their horizon."""
        self._relied.clear()

    def _entry(self, name: str, version: Version) -> _Reliance:
        return self._relied.setdefault((name, version[0]), _Reliance(version[2]))

    def decoded(self, name: str, version: Version, at: int, why: str) -> None:
        """Rows at ``at`` were decoded relying on ``version`` (``why``: for the message)."""
        entry = self._entry(name, version)
        if entry.rows_at is None:
            entry.rows_at, entry.why = at, why

    def described(self, name: str, version: Version, changes: list[dict[str, Any]], index: int) -> None:
        """``changes[index]`` (a schema change event's tableChanges entry) describes ``version``."""
        self._entry(name, version).changes.append((changes, index))

    def stated(self, name: str, version: Version | None, tdef: TableDef) -> None:
        """A full-metadata table map stated ``tdef`` while ``version`` applied."""
        if version is not None:
            entry = self._entry(name, version)
            entry.seen = entry.seen or tdef

    def horizon(self) -> int:
        """The binlog coordinate up to which later DDLs must still be checked."""
        return max((r.read_at for r in self._relied.values()), default=0)

    def ddl(self, name: str, at: int) -> None:
        """A DDL on ``name`` at ``at``: every version it disproves is repaired or stops the window.

        :raises SchemaError: rows were decoded with a version read after this DDL ran.
        """
        for (table, coord), entry in list(self._relied.items()):
            if table != name or not coord < at < entry.read_at:
                continue
            if entry.rows_at is not None:
                raise SchemaError(
                    f"table {name}: rows at binlog position {self.where(entry.rows_at)} cannot be decoded "
                    f"exactly: {entry.why}, and the schema history read the table's structure after the "
                    f"later DDL at {self.where(at)} ran (two DDLs on the table too close together)",
                    hint="set binlog_row_metadata=FULL (the table maps then name their columns; it applies "
                    "to events written from then on) and re-snapshot the table from a new offset",
                )
            for changes, index in entry.changes:
                self._repair(name, coord, changes, index, entry.seen)
            del self._relied[(table, coord)]

    def _repair(
        self, name: str, coord: int, changes: list[dict[str, Any]], index: int, seen: TableDef | None
    ) -> None:
        old = changes[index]
        if seen is not None:
            changes[index] = seen.table_change(old["type"])
            return
        # no row was logged before the next DDL: information_schema's answer is a later structure
        log.warning(
            "table %s: the structure after the DDL at %s is not known (a later DDL ran before it was "
            "read and no row was logged in between); its schema change event has no tableChanges entry",
            name,
            self.where(coord),
        )
        changes[index] = {}
