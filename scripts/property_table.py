"""Write the generated per-connector property tables into the README (``--check``: fail if stale).

    python scripts/property_table.py [--check]

The tables sit between ``<!-- properties:begin -->`` and ``<!-- properties:end -->``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow_cdc.readme import replace_section, write_or_check
from airflow_cdc.sources.property_table import BASE_CONFIGS, markdown, render_section

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- properties:begin -->", "<!-- properties:end -->"


def documented(connector: str) -> list[str]:
    """The checked-in list of property names the connector's seed documents."""
    path = ROOT / "docs" / "seed_properties" / f"{connector}.txt"
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def rendered_readme(readme: str) -> str:
    """The README with its generated section replaced by the current tables."""
    tables = {c: markdown(c, documented(c)) for c in BASE_CONFIGS}
    return replace_section(readme, BEGIN, END, render_section(tables))


def main(argv: list[str]) -> int:
    stale = "README.md property tables are stale: run python scripts/property_table.py"
    return write_or_check(ROOT / "README.md", rendered_readme, "--check" in argv, stale)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
