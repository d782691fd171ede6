"""Generated parts of the documentation site (``docs/``): text between two marker comments of a
page, rewritten or checked by the scripts that generate it (``scripts/property_table.py``,
``scripts/operator_reference.py``, ``scripts/cli_reference.py``), and the CLI reference rendered
from the command line parser itself."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path


def replace_section(page: str, begin: str, end: str, body: str) -> str:
    """``page`` with the text between the ``begin`` and ``end`` markers replaced by ``body``.

    Raises ``ValueError`` when a marker is missing."""
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def write_or_check(path: Path, render: Callable[[str], str], check: bool, stale: str) -> int:
    """Write ``render(current)`` to ``path``; with ``check``, only compare (1 and ``stale`` printed
    when it differs).  Returns the exit code; writing again changes nothing."""
    current = path.read_text(encoding="utf-8")
    fresh = render(current)
    if check:
        if fresh != current:
            print(stale)
            return 1
        return 0
    path.write_text(fresh, encoding="utf-8")
    return 0


def cli_reference(parser: argparse.ArgumentParser) -> str:
    """Markdown: the ``--help`` of the command and of each subcommand, as argparse prints it at a
    fixed width (so the text does not depend on the terminal)."""
    out = [_help_block(parser)]
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for action in subcommands:
        helps = {c.dest: c.help or "" for c in action._choices_actions}
        for name, sub in action.choices.items():
            summary = helps.get(name, "")
            summary = f"{summary[:1].upper()}{summary[1:]}.\n\n" if summary else ""
            out.append(f"## `{parser.prog} {name}`\n\n{summary}{_help_block(sub)}")
    return "\n".join(out)


def _help_block(parser: argparse.ArgumentParser) -> str:
    formatter_class = parser.formatter_class
    parser.formatter_class = functools.partial(formatter_class, width=100)  # type: ignore[call-arg,assignment]
    try:
        text = parser.format_help()
    finally:
        parser.formatter_class = formatter_class
    return f"```text\n{text.rstrip()}\n```\n"
