"""The safe language of ad hoc snapshot ``additional-conditions``, and its SQL in each dialect.

An ``execute-snapshot`` signal may come from anyone allowed to trigger a DAG; its filter must not
be SQL run as the replication user.  So a filter is parsed here, by our own small parser, into
predicates on the snapshotted table's columns, and each source renders it with its own identifier
quoting and its literals as bound parameters (PostgreSQL's ``COPY`` takes none: psycopg's
``sql.Literal`` there).  The language::

    condition := term { OR term }          term := factor { AND factor }
    factor    := NOT factor | ( condition ) | predicate
    predicate := column ( = | <> | != | < | <= | > | >= ) literal
               | column IS [NOT] NULL
               | column [NOT] IN ( literal { , literal } )
               | column [NOT] BETWEEN literal AND literal
    column    := name | "quoted name" ("" for a quote)
    literal   := [+|-] number | 'string' ('' for a quote) | TRUE | FALSE
               | DATE 'YYYY-MM-DD' | TIMESTAMP 'YYYY-MM-DD HH:MM[:SS[.ffffff]]'

Keywords are case-insensitive.  A bare column name matches the table's column of that name, or
else the only one equal ignoring case; a quoted one must match exactly.  Anything else (functions,
operators, subqueries, comments, ``;``, other quoting) is a :class:`ConfigError`.  Raw SQL, as in
Debezium, only with the pipeline property :data:`RAW_SQL_PROPERTY` (ours, not Debezium's).
Parsing never raises anything but :class:`ConfigError`, whatever the input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_cdc.core.condition_parser import (
    MAX_DEPTH,
    MAX_LITERALS,
    BoolOp,
    Compare,
    InList,
    IsNull,
    Node,
    Not,
    Parser,
    Refused,
    Value,
    tokens,
)
from airflow_cdc.core.errors import ConfigError

__all__ = [
    "LANGUAGE",
    "MAX_DEPTH",
    "MAX_LITERALS",
    "MAX_LENGTH",
    "RAW_SQL_PROPERTY",
    "Condition",
    "Piece",
    "Value",
    "condition_pieces",
    "parse_condition",
    "pieces_to_text",
]

#: Pipeline property (ours): pass ``additional-conditions`` to the source as raw SQL, unparsed.
RAW_SQL_PROPERTY = "snapshot.additional.conditions.raw.sql"

LANGUAGE = (
    "an additional condition compares columns of the table with literals: column = <> != < <= > >= "
    "literal, column IS [NOT] NULL, column [NOT] IN (literal, ...), column [NOT] BETWEEN literal AND "
    "literal, combined with AND, OR, NOT and parentheses; literals are numbers, 'strings' ('' for a "
    "quote), TRUE, FALSE, DATE 'YYYY-MM-DD' and TIMESTAMP 'YYYY-MM-DD HH:MM:SS'; names with other "
    'characters or case in "double quotes". To pass raw SQL instead (run as the connector\'s '
    f"database user), set the pipeline property {RAW_SQL_PROPERTY}=true"
)

MAX_LENGTH = 20_000

#: One piece of a rendered condition: ("sql", fixed text) | ("raw", user SQL) | ("ident", column)
#: | ("value", literal value).
Piece = tuple[str, Any]


@dataclass(frozen=True)
class Condition:
    """A parsed additional condition; column names are the table's own (resolved)."""

    text: str
    node: Node

    def columns(self) -> set[str]:
        found: set[str] = set()
        _walk_columns(self.node, found)
        return found

    def pieces(self) -> list[Piece]:
        """The condition as SQL pieces (parenthesised) for a source's renderer."""
        out: list[Piece] = []
        _render(self.node, out)
        return out


def _walk_columns(node: Node, found: set[str]) -> None:
    if isinstance(node, Not):
        _walk_columns(node.item, found)
    elif isinstance(node, BoolOp):
        for item in node.items:
            _walk_columns(item, found)
    else:
        found.add(node.column)


def _render(node: Node, out: list[Piece]) -> None:
    if isinstance(node, BoolOp):
        out.append(("sql", "("))
        for n, item in enumerate(node.items):
            if n:
                out.append(("sql", f" {node.op} "))
            _render(item, out)
        out.append(("sql", ")"))
        return
    if isinstance(node, Not):
        out.append(("sql", "(NOT "))
        _render(node.item, out)
        out.append(("sql", ")"))
        return
    out += [("sql", "("), ("ident", node.column)]
    neg = "NOT " if getattr(node, "negated", False) else ""
    if isinstance(node, Compare):
        out += [("sql", f" {node.op} "), ("value", node.value)]
    elif isinstance(node, IsNull):
        out.append(("sql", f" IS {neg}NULL"))
    elif isinstance(node, InList):
        out.append(("sql", f" {neg}IN ("))
        for n, value in enumerate(node.values):
            out += [("sql", ", ")] if n else []
            out.append(("value", value))
        out.append(("sql", ")"))
    else:
        out += [("sql", f" {neg}BETWEEN "), ("value", node.low), ("sql", " AND "), ("value", node.high)]
    out.append(("sql", ")"))


def _resolver(table: str, columns: Sequence[str] | None) -> Callable[[str, bool, int], str]:
    def resolve(name: str, quoted: bool, pos: int) -> str:
        if columns is None or name in columns:
            return name
        if not quoted:
            folded = [c for c in columns if c.casefold() == name.casefold()]
            if len(folded) == 1:
                return folded[0]
            if folded:
                raise Refused(f"column {name!r} is ambiguous ({', '.join(folded)}): quote it", pos)
        shown = ", ".join(list(columns)[:30]) + (" ..." if len(columns) > 30 else "")
        raise Refused(f"table {table} has no column {name!r} (columns: {shown})", pos)

    return resolve


def parse_condition(text: str, table: str = "the table", columns: Sequence[str] | None = None) -> Condition:
    """Parse an additional condition of ``table`` in the safe language (module docstring).

    :param columns: the table's columns, when the source knows them; every column named must be one.
    :raises ConfigError: anything outside the language, or an unknown column; the message names
        the table, what is wrong and where, and the hint says what is allowed and how to allow raw SQL.
    """
    where = f"additional-conditions of {table}"
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where}: the condition is empty", hint=LANGUAGE)
    if len(text) > MAX_LENGTH:
        raise ConfigError(f"{where}: the condition is longer than {MAX_LENGTH} characters", hint=LANGUAGE)
    try:
        node = Parser(tokens(text), _resolver(table, columns)).parse()
    except Refused as e:
        near = text[e.pos : e.pos + 30]
        at = f" at character {e.pos + 1} ({near!r})" if near else " at the end"
        raise ConfigError(f"{where}: {e.what}{at}", hint=LANGUAGE) from None
    return Condition(text, node)


def condition_pieces(
    table: str, text: str | None, columns: Sequence[str] | None, raw_sql: bool
) -> list[Piece] | None:
    """An additional condition of ``table`` ready for a source's SQL; None without one.

    With ``raw_sql`` (the pipeline's :data:`RAW_SQL_PROPERTY`) the text is passed unparsed, as one
    ``("raw", text)`` piece (Debezium semantics); otherwise it is parsed and checked against
    ``columns``.  Called when a signal is queued and again at every chunk read, so turning the
    property off also stops the raw conditions of snapshots already pending.

    :raises ConfigError: see :func:`parse_condition`.
    """
    if text is None or not str(text).strip():
        return None
    if raw_sql:
        return [("raw", str(text))]
    return parse_condition(str(text), table, columns).pieces()


def pieces_to_text(
    pieces: Sequence[Piece],
    quote: Callable[[str], str],
    placeholder: str,
    value: Callable[[Value], Any] = lambda v: v,
    escape: Callable[[str], str] = lambda s: s,
) -> tuple[str, list[Any]]:
    """SQL text with ``placeholder`` for each literal, and the parameters in order.

    :param quote: the dialect's identifier quoting.
    :param value: converts a literal to the driver's parameter (e.g. dates as text).
    :param escape: applied to every text piece (``%`` doubled for ``format``-style drivers).
    """
    text: list[str] = []
    params: list[Any] = []
    for kind, item in pieces:
        if kind == "value":
            text.append(placeholder)
            params.append(value(item))
        elif kind == "ident":
            text.append(escape(quote(item)))
        else:
            text.append(escape(item))
    return "".join(text), params
