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

import datetime as dt
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from airflow_cdc.core.errors import ConfigError

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
MAX_DEPTH = 50
MAX_LITERALS = 1_000

Value = int | Decimal | str | bool | dt.date | dt.datetime
#: One piece of a rendered condition: ("sql", fixed text) | ("raw", user SQL) | ("ident", column)
#: | ("value", literal value).
Piece = tuple[str, Any]

_TOKEN = re.compile(
    r"(?P<ws>\s+)"
    r"|(?P<num>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
    r"|(?P<str>'(?:[^']|'')*')"
    r'|(?P<qid>"(?:[^"]|"")+")'
    r"|(?P<word>[^\W\d]\w*)"
    r"|(?P<op><>|!=|<=|>=|=|<|>)"
    r"|(?P<punct>[(),])"
    r"|(?P<sign>[-+])"
)
_RESERVED = {"AND", "OR", "NOT", "IS", "NULL", "IN", "BETWEEN", "TRUE", "FALSE"}
#: SQL words that are never a bare column name here: said plainly instead of "no such column"
_SQL_WORDS = frozenset(
    "SELECT FROM WHERE UNION EXISTS CASE WHEN LIKE ILIKE SIMILAR REGEXP RLIKE EXEC EXECUTE DECLARE INTO "
    "WITH ANY ALL SOME CAST COLLATE ESCAPE DROP DELETE INSERT UPDATE CREATE ALTER GRANT TRUNCATE".split()
)
_COMPARISONS = {"=", "<>", "!=", "<", "<=", ">", ">="}
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[ T][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,6})?)?")
_INT64 = 2**63


@dataclass(frozen=True)
class Token:
    kind: str  # num | str | qid | word | op | punct | sign | end
    text: str
    pos: int


# -- the tree ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compare:
    column: str
    op: str
    value: Value


@dataclass(frozen=True)
class IsNull:
    column: str
    negated: bool


@dataclass(frozen=True)
class InList:
    column: str
    values: tuple[Value, ...]
    negated: bool


@dataclass(frozen=True)
class Between:
    column: str
    low: Value
    high: Value
    negated: bool


@dataclass(frozen=True)
class Not:
    item: Node


@dataclass(frozen=True)
class BoolOp:
    op: str  # AND | OR
    items: tuple[Node, ...]


Node = Compare | IsNull | InList | Between | Not | BoolOp


# -- lexer and parser --------------------------------------------------------------------------


class _Refused(Exception):
    """A parse failure at ``pos``; turned into a ConfigError naming the table."""

    def __init__(self, what: str, pos: int) -> None:
        super().__init__(what)
        self.what, self.pos = what, pos


def _tokens(text: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    while pos < len(text):
        if text.startswith(("--", "/*"), pos):
            raise _Refused("comments are not allowed", pos)
        m = _TOKEN.match(text, pos)
        if m is None:
            ch = text[pos]
            if ch in "'\"":
                raise _Refused(f"unterminated {'string' if ch == chr(39) else 'quoted name'}", pos)
            raise _Refused(f"character {ch!r} is not allowed", pos)
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append(Token(kind, m.group(), pos))
        pos = m.end()
    out.append(Token("end", "", len(text)))
    return out


class _Parser:
    def __init__(self, tokens: list[Token], resolve: Callable[[str, bool, int], str]) -> None:
        self.tokens, self.i, self.depth, self.literals = tokens, 0, 0, 0
        self.resolve = resolve

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def keyword(self, *words: str) -> str | None:
        tok = self.tok
        if tok.kind == "word" and tok.text.upper() in words:
            self.i += 1
            return tok.text.upper()
        return None

    def expect(self, kind: str, text: str, what: str) -> None:
        tok = self.tok
        if tok.kind != kind or tok.text.upper() != text:
            raise _Refused(f"expected {what}, found {_shown(tok)}", tok.pos)
        self.i += 1

    def parse(self) -> Node:
        node = self.condition()
        if self.tok.kind != "end":
            raise _Refused(f"expected AND, OR or the end, found {_shown(self.tok)}", self.tok.pos)
        return node

    def condition(self) -> Node:
        items = [self.term()]
        while self.keyword("OR"):
            items.append(self.term())
        return items[0] if len(items) == 1 else BoolOp("OR", tuple(items))

    def term(self) -> Node:
        items = [self.factor()]
        while self.keyword("AND"):
            items.append(self.factor())
        return items[0] if len(items) == 1 else BoolOp("AND", tuple(items))

    def factor(self) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Refused(f"nested deeper than {MAX_DEPTH} levels", self.tok.pos)
        try:
            if self.keyword("NOT"):
                return Not(self.factor())
            if self.tok.kind == "punct" and self.tok.text == "(":
                self.i += 1
                node = self.condition()
                self.expect("punct", ")", "')'")
                return node
            return self.predicate()
        finally:
            self.depth -= 1

    def column(self) -> str:
        tok = self.tok
        if tok.kind == "qid":
            self.i += 1
            return self.resolve(tok.text[1:-1].replace('""', '"'), True, tok.pos)
        if tok.kind == "word" and tok.text.upper() not in _RESERVED:
            after = self.tokens[self.i + 1]
            if after.kind == "punct" and after.text == "(":
                raise _Refused(f"function calls ({tok.text}(...)) are not allowed", tok.pos)
            if tok.text.upper() in _SQL_WORDS:
                raise _Refused(
                    f"SQL keyword {tok.text.upper()} is not allowed (quote a column so named)", tok.pos
                )
            self.i += 1
            return self.resolve(tok.text, False, tok.pos)
        raise _Refused(f"expected a column name, found {_shown(tok)}", tok.pos)

    def predicate(self) -> Node:
        column = self.column()
        tok = self.tok
        if tok.kind == "op":
            self.i += 1
            return Compare(column, "<>" if tok.text == "!=" else tok.text, self.literal())
        if self.keyword("IS"):
            negated = self.keyword("NOT") is not None
            self.expect("word", "NULL", "NULL after IS [NOT]")
            return IsNull(column, negated)
        negated = self.keyword("NOT") is not None
        if self.keyword("IN"):
            self.expect("punct", "(", "'(' after IN")
            values = [self.literal()]
            while self.tok.kind == "punct" and self.tok.text == ",":
                self.i += 1
                values.append(self.literal())
            self.expect("punct", ")", "',' or ')' in the IN list")
            return InList(column, tuple(values), negated)
        if self.keyword("BETWEEN"):
            low = self.literal()
            self.expect("word", "AND", "AND after BETWEEN's first value")
            return Between(column, low, self.literal(), negated)
        raise _Refused(
            f"expected a comparison (= <> != < <= > >=), IS, IN or BETWEEN after column "
            f"{column!r}, found {_shown(tok)}",
            tok.pos,
        )

    def literal(self) -> Value:
        self.literals += 1
        tok = self.tok
        if self.literals > MAX_LITERALS:
            raise _Refused(f"more than {MAX_LITERALS} literals", tok.pos)
        self.i += 1
        if tok.kind == "sign" and self.tok.kind == "num":
            number = self.tok.text
            self.i += 1
            return _number(("-" if tok.text == "-" else "") + number)
        if tok.kind == "num":
            return _number(tok.text)
        if tok.kind == "str":
            return _string(tok)
        word = tok.text.upper() if tok.kind == "word" else ""
        if word in ("TRUE", "FALSE"):
            return word == "TRUE"
        if word in ("DATE", "TIMESTAMP") and self.tok.kind == "str":
            text = _string(self.tok)
            self.i += 1
            return _temporal(word, text, tok.pos)
        if word == "NULL":
            raise _Refused("NULL is not a value here: use column IS [NOT] NULL", tok.pos)
        if tok.kind == "word" and self.tok.kind == "punct" and self.tok.text == "(":
            raise _Refused(f"function calls ({tok.text}(...)) are not allowed", tok.pos)
        if tok.kind in ("word", "qid") and word not in _RESERVED:
            raise _Refused(
                f"expected a literal, found {_shown(tok)} (columns compare with literals only)", tok.pos
            )
        raise _Refused(f"expected a literal, found {_shown(tok)}", tok.pos)


def _shown(tok: Token) -> str:
    return "the end" if tok.kind == "end" else repr(tok.text[:40])


def _number(text: str) -> int | Decimal:
    if re.fullmatch(r"-?[0-9]+", text):
        value = int(text)
        # beyond 64 bits a driver may refuse an int parameter; a Decimal binds as NUMERIC
        return value if -_INT64 <= value < _INT64 else Decimal(text)
    return Decimal(text)


def _string(tok: Token) -> str:
    text = tok.text[1:-1].replace("''", "'")
    if "\0" in text:
        raise _Refused("a string may not contain a NUL character", tok.pos)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _Refused("a string is not valid Unicode (lone surrogate)", tok.pos) from e
    return text


def _temporal(kind: str, text: str, pos: int) -> dt.date | dt.datetime:
    pattern = _DATE if kind == "DATE" else _TIMESTAMP
    try:
        if not pattern.fullmatch(text):
            raise ValueError(text)
        if kind == "DATE":
            return dt.date.fromisoformat(text)
        return dt.datetime.fromisoformat(text)
    except ValueError:
        form = "'YYYY-MM-DD'" if kind == "DATE" else "'YYYY-MM-DD HH:MM[:SS[.ffffff]]' (no time zone)"
        raise _Refused(f"{kind} {text!r} is not a valid {kind.lower()}: write {kind} {form}", pos) from None


# -- the public API ----------------------------------------------------------------------------


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
                raise _Refused(f"column {name!r} is ambiguous ({', '.join(folded)}): quote it", pos)
        shown = ", ".join(list(columns)[:30]) + (" ..." if len(columns) > 30 else "")
        raise _Refused(f"table {table} has no column {name!r} (columns: {shown})", pos)

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
        node = _Parser(_tokens(text), _resolver(table, columns)).parse()
    except _Refused as e:
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
