"""Write the generated per-connector property tables into the docs site (``--check``: fail if stale).

    python scripts/property_table.py [--check]

Each table sits between ``<!-- properties:begin -->`` and ``<!-- properties:end -->`` of
``docs/reference/properties/<connector>.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow_cdc.readme import replace_section, write_or_check
from airflow_cdc.sources.property_table import BASE_CONFIGS, markdown

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- properties:begin -->", "<!-- properties:end -->"


def page_path(connector: str) -> Path:
    """The connector's reference page, relative to the repository root."""
    return Path("docs") / "reference" / "properties" / f"{connector}.md"


def documented(connector: str) -> list[str]:
    """The checked-in list of property names the connector's seed documents."""
    path = ROOT / "docs" / "seed_properties" / f"{connector}.txt"
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def rendered(connector: str, page: str) -> str:
    """The connector's page with its generated table replaced by the current one."""
    return replace_section(page, BEGIN, END, markdown(connector, documented(connector)) + "\n")


def main(argv: list[str]) -> int:
    code = 0
    for connector in BASE_CONFIGS:
        stale = f"{page_path(connector)} is stale: run python scripts/property_table.py"
        render = lambda page, c=connector: rendered(c, page)  # noqa: E731
        code = max(code, write_or_check(ROOT / page_path(connector), render, "--check" in argv, stale))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
