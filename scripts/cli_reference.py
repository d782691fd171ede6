"""Write the generated CLI reference into the docs site (``--check``: fail if stale).

    python scripts/cli_reference.py [--check]

The reference sits between ``<!-- cli-reference:begin -->`` and ``<!-- cli-reference:end -->`` of
``docs/reference/cli.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow_cdc.cli import parser
from airflow_cdc.readme import cli_reference, replace_section, write_or_check

ROOT = Path(__file__).resolve().parents[1]
PAGE = Path("docs") / "reference" / "cli.md"
BEGIN, END = "<!-- cli-reference:begin -->", "<!-- cli-reference:end -->"


def rendered(page: str) -> str:
    return replace_section(page, BEGIN, END, cli_reference(parser()))


def main(argv: list[str]) -> int:
    stale = f"{PAGE} is stale: run python scripts/cli_reference.py"
    return write_or_check(ROOT / PAGE, rendered, "--check" in argv, stale)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
