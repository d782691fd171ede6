"""Table and column selection with Debezium's include/exclude list semantics.

Each list is a set of regular expressions matched against the *whole* identifier
(``schema.table`` for tables, ``schema.table.column`` for columns), as Debezium does.
Include and exclude lists of the same kind cannot both be set.  Key columns are always kept,
whatever the column lists say.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import ConfigError


def compile_patterns(
    where: str, patterns: Sequence[str], what: str = "regular expression"
) -> tuple[re.Pattern[str], ...]:
    """Compile regexes; a bad one is a :class:`ConfigError` naming ``where`` (e.g. the property)."""
    out = []
    for pattern in patterns:
        try:
            out.append(re.compile(pattern))
        except re.error as e:
            raise ConfigError(f"{where}: invalid {what} {pattern!r}: {e}") from e
    return tuple(out)


def any_full_match(patterns: Sequence[re.Pattern[str]], text: str) -> bool:
    return any(p.fullmatch(text) for p in patterns)


class IncludeExclude:
    """One Debezium include/exclude list pair: when the include list is set only full matches
    pass, otherwise everything not fully matched by the exclude list passes.

    :raises ConfigError: both lists are set, or a regex is invalid.
    """

    def __init__(
        self, include_prop: str, include: Sequence[str], exclude_prop: str, exclude: Sequence[str]
    ) -> None:
        if include and exclude:
            raise ConfigError(f"properties {include_prop!r} and {exclude_prop!r} cannot both be set")
        self._include = compile_patterns(f"property {include_prop!r}", include)
        self._exclude = compile_patterns(f"property {exclude_prop!r}", exclude)

    def __call__(self, text: str) -> bool:
        if self._include:
            return any_full_match(self._include, text)
        return not any_full_match(self._exclude, text)


@dataclass(frozen=True)
class TableId:
    """A fully-qualified table; ``str()`` gives Debezium's ``schema.table`` form (unquoted)."""

    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"

    @classmethod
    def parse(cls, text: str, default_schema: str = "public") -> TableId:
        """Parse ``schema.table``; double quotes protect dots, as in ``"my.schema"."t 1"``."""
        parts = _split_quoted(text)
        if len(parts) == 1:
            return cls(default_schema, parts[0])
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        raise ConfigError(
            f"cannot parse table name {text!r}: expected schema.table "
            "(quote parts containing dots with double quotes)"
        )


def _split_quoted(text: str) -> list[str]:
    parts: list[str] = []
    buf: list[str] = []
    i, quoted = 0, False
    while i < len(text):
        ch = text[i]
        if ch == '"':
            if quoted and i + 1 < len(text) and text[i + 1] == '"':
                buf.append('"')
                i += 1
            else:
                quoted = not quoted
        elif ch == "." and not quoted:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    parts.append("".join(buf))
    if quoted or any(p == "" for p in parts):
        raise ConfigError(f"cannot parse table name {text!r}")
    return parts


class TableFilter:
    """Decides which tables and columns are captured."""

    def __init__(self, config: ConnectorConfig) -> None:
        self._lists = {
            kind: IncludeExclude(
                f"{kind}.include.list",
                config[f"{kind}.include.list"],
                f"{kind}.exclude.list",
                config[f"{kind}.exclude.list"],
            )
            for kind in ("schema", "table", "column")
        }
        self._key_columns = parse_message_key_columns(config["message.key.columns"])

    def _allowed(self, kind: str, text: str) -> bool:
        return self._lists[kind](text)

    def includes_table(self, table: TableId) -> bool:
        return self._allowed("schema", table.schema) and self._allowed("table", str(table))

    def includes_column(self, table: TableId, column: str, is_key: bool = False) -> bool:
        return is_key or self._allowed("column", f"{table}.{column}")

    def message_key_columns(self, table: TableId) -> tuple[str, ...] | None:
        """Key columns configured by ``message.key.columns`` for ``table``, if any."""
        for pattern, columns in self._key_columns:
            if pattern.fullmatch(str(table)):
                return columns
        return None


def parse_message_key_columns(raw: str | None) -> tuple[tuple[re.Pattern[str], tuple[str, ...]], ...]:
    """Parse ``<table regex>:<col>,<col>;<table regex>:<col>``.

    :raises ConfigError: naming the malformed entry.
    """
    if not raw:
        return ()
    out = []
    for entry in (e.strip() for e in raw.split(";")):
        if not entry:
            continue
        table, sep, cols = entry.rpartition(":")
        columns = tuple(c.strip() for c in cols.split(",") if c.strip())
        if not sep or not table.strip() or not columns:
            raise ConfigError(
                f"property 'message.key.columns': cannot parse entry {entry!r}; "
                "expected <schema.table>:<column>[,<column>...]"
            )
        out.append((compile_patterns("property 'message.key.columns'", [table.strip()])[0], columns))
    return tuple(out)
