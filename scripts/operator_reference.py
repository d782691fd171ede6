"""Write the provider's generated parameter reference into the README (``--check``: fail if stale).

    python scripts/operator_reference.py [--check]

The reference sits between ``<!-- provider-reference:begin -->`` and ``<!-- provider-reference:end -->``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from airflow_cdc.airflow.reference import reference

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- provider-reference:begin -->", "<!-- provider-reference:end -->"


def rendered_readme(readme: str) -> str:
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{reference()}{END}{tail}"


def main(argv: list[str]) -> int:
    path = ROOT / "README.md"
    current = path.read_text(encoding="utf-8")
    fresh = rendered_readme(current)
    if "--check" in argv:
        if fresh != current:
            print("README.md provider reference is stale: run python scripts/operator_reference.py")
            return 1
        return 0
    path.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
