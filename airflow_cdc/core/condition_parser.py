"""Lexer and recursive-descent parser of the additional-conditions language (grammar: see
:mod:`airflow_cdc.core.conditions`, the public API), and its tree.

Pure: no I/O, bounded recursion (:data:`MAX_DEPTH`) and size (:data:`MAX_LITERALS`); every
failure is a :class:`Refused` with the character position, whatever the input.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

MAX_DEPTH = 50
MAX_LITERALS = 1_000

Value = int | Decimal | str | bool | dt.date | dt.datetime

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


class Refused(Exception):
    """A parse failure at ``pos``; turned into a ConfigError naming the table."""

    def __init__(self, what: str, pos: int) -> None:
        super().__init__(what)
        self.what, self.pos = what, pos


def tokens(text: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    while pos < len(text):
        if text.startswith(("--", "/*"), pos):
            raise Refused("comments are not allowed", pos)
        m = _TOKEN.match(text, pos)
        if m is None:
            ch = text[pos]
            if ch in "'\"":
                raise Refused(f"unterminated {'string' if ch == chr(39) else 'quoted name'}", pos)
            raise Refused(f"character {ch!r} is not allowed", pos)
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append(Token(kind, m.group(), pos))
        pos = m.end()
    out.append(Token("end", "", len(text)))
    return out


class Parser:
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
            raise Refused(f"expected {what}, found {_shown(tok)}", tok.pos)
        self.i += 1

    def parse(self) -> Node:
        node = self.condition()
        if self.tok.kind != "end":
            raise Refused(f"expected AND, OR or the end, found {_shown(self.tok)}", self.tok.pos)
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
            raise Refused(f"nested deeper than {MAX_DEPTH} levels", self.tok.pos)
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
                raise Refused(f"function calls ({tok.text}(...)) are not allowed", tok.pos)
            if tok.text.upper() in _SQL_WORDS:
                raise Refused(
                    f"SQL keyword {tok.text.upper()} is not allowed (quote a column so named)", tok.pos
                )
            self.i += 1
            return self.resolve(tok.text, False, tok.pos)
        raise Refused(f"expected a column name, found {_shown(tok)}", tok.pos)

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
        raise Refused(
            f"expected a comparison (= <> != < <= > >=), IS, IN or BETWEEN after column "
            f"{column!r}, found {_shown(tok)}",
            tok.pos,
        )

    def literal(self) -> Value:
        self.literals += 1
        tok = self.tok
        if self.literals > MAX_LITERALS:
            raise Refused(f"more than {MAX_LITERALS} literals", tok.pos)
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
            raise Refused("NULL is not a value here: use column IS [NOT] NULL", tok.pos)
        if tok.kind == "word" and self.tok.kind == "punct" and self.tok.text == "(":
            raise Refused(f"function calls ({tok.text}(...)) are not allowed", tok.pos)
        if tok.kind in ("word", "qid") and word not in _RESERVED:
            raise Refused(
                f"expected a literal, found {_shown(tok)} (columns compare with literals only)", tok.pos
            )
        raise Refused(f"expected a literal, found {_shown(tok)}", tok.pos)


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
        raise Refused("a string may not contain a NUL character", tok.pos)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Refused("a string is not valid Unicode (lone surrogate)", tok.pos) from e
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
        raise Refused(f"{kind} {text!r} is not a valid {kind.lower()}: write {kind} {form}", pos) from None
