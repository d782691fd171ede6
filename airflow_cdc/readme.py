"""Generated sections of the README: text between two marker comments, rewritten or checked by the
scripts that generate it (``scripts/property_table.py``, ``scripts/operator_reference.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def replace_section(readme: str, begin: str, end: str, body: str) -> str:
    """``readme`` with the text between the ``begin`` and ``end`` markers replaced by ``body``."""
    head, rest = readme.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"


def write_or_check(path: Path, render: Callable[[str], str], check: bool, stale: str) -> int:
    """Write ``render(current)`` to ``path``; with ``check``, only compare (1 and ``stale`` printed
    when it differs).  Returns the exit code."""
    current = path.read_text(encoding="utf-8")
    fresh = render(current)
    if check:
        if fresh != current:
            print(stale)
            return 1
        return 0
    path.write_text(fresh, encoding="utf-8")
    return 0
