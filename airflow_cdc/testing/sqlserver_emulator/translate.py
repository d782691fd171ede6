"""T-SQL ``SELECT`` -> PostgreSQL for the fixed statement set of the SQL Server source.

Not a T-SQL engine: the rewrites are lexical and cover what the source sends — bracket quoting,
``N'...'`` literals, ``0x..`` binary literals, ``@P1`` parameters, ``TOP (n)``, three-part names
``[db].[schema].[table]`` (the database selects the backing PostgreSQL database), ``ISNULL`` and
``cdc.fn_cdc_get_all_changes_<ci>(@from, @to, N'all update old')``, which becomes a subquery over
the change table after SQL Server's range check (error 313).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from airflow_cdc.testing.sqlserver_emulator.server import SqlError

_LITERAL = re.compile(r"(N?'(?:[^']|'')*')")
_BRACKET = re.compile(r"\[((?:[^\]]|\]\])*)\]")
_PARAM = re.compile(r"@(\w+)")
_BINARY = re.compile(r"\b0x([0-9A-Fa-f]*)\b")
_TOP = re.compile(r"^(\s*SELECT\s+(?:DISTINCT\s+)?)TOP\s*(?:\(\s*([^)]+?)\s*\)|(\d+))\s*", re.IGNORECASE)
_PART = r'(?:"(?:[^"]|"")+"|[A-Za-z_#][\w$#]*)'
_THREE_PART = re.compile(rf'(?<![\w."])({_PART})\.(?={_PART}\.{_PART})')
_CHANGES = re.compile(
    r'cdc\.(?:"fn_cdc_get_all_changes_((?:[^"]|"")+)"|fn_cdc_get_all_changes_(\w+))\s*\(\s*([^,]+?)\s*,'
    r"\s*([^,]+?)\s*,\s*'([^']*)'\s*\)(\s+(?:AS\s+)?(?!ORDER\b|WHERE\b|JOIN\b|INNER\b|LEFT\b|CROSS\b)\w+)?",
    re.IGNORECASE,
)
_MARK = "__emulator_changes__"


@dataclass(frozen=True)
class Query:
    sql: str
    params: dict[str, Any]
    database: str | None  # from a three-part name, else the session's database
    capture_instance: str | None = None
    change_args: tuple[str, str, str] = ("", "", "")
    alias: str = ""

    def with_change_function(self, captured: Sequence[str]) -> Query:
        """Replace the all-changes call by its subquery over ``cdc.<ci>_CT`` (columns in order)."""
        ci = self.capture_instance or ""
        lo, hi, option = self.change_args
        cols = ", ".join(
            _quote(c) for c in ["__$start_lsn", "__$seqval", "__$operation", "__$update_mask", *captured]
        )
        skip_old = "" if option.lower() == "all update old" else ' AND "__$operation" <> 3'
        # identifiers quoted; the bounds are the statement's own placeholders or literals
        sub = (
            f"(SELECT {cols} FROM cdc.{_quote(ci + '_CT')} WHERE sys.fn_cdc_check_range("  # noqa: S608
            f'{_literal(ci)}, {lo}, {hi}) AND "__$start_lsn" BETWEEN {lo} AND {hi}{skip_old})'
            f"{self.alias or ' AS __changes'}"
        )
        return replace(self, sql=self.sql.replace(_MARK, sub), capture_instance=None)


def split_statements(text: str) -> list[str]:
    """Split a batch on ``;`` outside literals and brackets; drop empty statements."""
    out, buf, quote = [], [], ""
    for ch in text:
        if quote:
            buf.append(ch)
            if ch == quote:
                quote = ""
        elif ch in "'[":
            quote = "'" if ch == "'" else "]"
            buf.append(ch)
        elif ch == ";":
            out.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
    out.append("".join(buf))
    return [s.strip() for s in out if s.strip()]


def translate_select(
    stmt: str, params: Mapping[str, Any], databases: Mapping[str, Any], current: str
) -> Query:
    """Translate one SELECT; raise :class:`SqlError` for undeclared parameters or unknown databases."""
    parts = _LITERAL.split(stmt)
    out = []
    for n, part in enumerate(parts):
        if n % 2:  # a literal
            text = part[1:] if part.startswith("N") else part
            out.append(text.replace("%", "%%"))
        else:
            out.append(_code(part, params))
    text = "".join(out)
    if m := _TOP.match(text):
        text = m.group(1) + text[m.end() :] + f" LIMIT {m.group(2) or m.group(3)}"
    database, text = _strip_database(text, databases)
    ci = None
    args: tuple[str, str, str] = ("", "", "")
    alias = ""
    if m := _CHANGES.search(text):
        ci = (m.group(1) or "").replace('""', '"') or m.group(2)
        args = (m.group(3), m.group(4), m.group(5).replace("%%", "%"))
        alias = m.group(6) or ""
        text = text[: m.start()] + _MARK + text[m.end() :]
    return Query(text, dict(params), database, ci, args, alias)


def _code(part: str, params: Mapping[str, Any]) -> str:
    part = part.replace("%", "%%")
    part = _BRACKET.sub(lambda m: _quote(m.group(1).replace("]]", "]")), part)

    def param(m: re.Match[str]) -> str:
        if m.group(1) not in params:
            raise SqlError(137, f'Must declare the scalar variable "@{m.group(1)}".', severity=15, state=2)
        return f"%({m.group(1)})s"

    part = re.sub(r"@@(\w+)", lambda m: f"__at_at_{m.group(1)}", part)
    part = _PARAM.sub(param, part)
    part = _BINARY.sub(lambda m: f"'\\x{m.group(1)}'::bytea", part)
    return re.sub(r"\bISNULL\s*\(", "COALESCE(", part, flags=re.IGNORECASE)


def _strip_database(text: str, databases: Mapping[str, Any]) -> tuple[str | None, str]:
    found: set[str] = set()

    def strip(m: re.Match[str]) -> str:
        name = m.group(1)
        name = name[1:-1].replace('""', '"') if name.startswith('"') else name
        if name.lower() not in databases:
            raise SqlError(
                911, f"Database '{name}' does not exist. Make sure that the name is entered correctly."
            )
        found.add(databases[name.lower()].name)
        return ""

    text = _THREE_PART.sub(strip, text)
    if len(found) > 1:
        raise SqlError(50000, f"emulator: one statement may name one database, not {sorted(found)}")
    return (found.pop() if found else None), text


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
