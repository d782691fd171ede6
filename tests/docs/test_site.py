"""The documentation site (``docs/``, ``mkdocs.yml``) builds without a broken link or anchor and
with every page in the nav; the examples of the getting-started pages marked runnable run; the
generated CLI reference is current; the error page covers every error class; the README stays short.

Runnable examples.  A fenced block right after the line ``<!-- runnable -->`` is run by
:func:`test_runnable_example`, in page order, all blocks of one page in one scratch directory:

* a block with a ``title="<file>"`` attribute (```` ```yaml title="pipeline.yaml" ````) is written
  to that file (Material shows the title above the block);
* any other block is a bash script, run with ``set -euo pipefail`` and ``.venv/bin`` first on
  ``PATH``; it must exit 0.

Mark only cheap, offline commands (``airflow-cdc status`` on a pipeline file, ``--help``): no
server is started for them.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
MARKER = "<!-- runnable -->"
_FENCE = re.compile(r"^(`{3,})(\S*)(.*)$")
_TITLE = re.compile(r'title="([^"]+)"')


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    title: str | None  # a file to write, or None: a bash script
    text: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(DOCS)}:{self.line}"


def runnable_blocks(page: Path) -> list[Block]:
    """The blocks of ``page`` that follow a ``<!-- runnable -->`` line, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        fence = _FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
        assert fence, f"{page}:{i + 1}: {MARKER} must be followed by a fenced code block"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == fence.group(1))
        title = _TITLE.search(fence.group(3))
        text = "\n".join(lines[i + 2:end]) + "\n"
        blocks.append(Block(page, i + 2, title.group(1) if title else None, text))
    return blocks


GETTING_STARTED = sorted((DOCS / "getting-started").glob("*.md"))
PAGES_WITH_EXAMPLES = [p for p in GETTING_STARTED if runnable_blocks(p)]


def test_mkdocs_build_strict(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, or a page left out of the nav, fails."""
    proc = subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert (tmp_path / "site" / "getting-started" / "postgresql" / "index.html").is_file()


def test_getting_started_pages_have_runnable_examples():
    names = {p.name for p in PAGES_WITH_EXAMPLES}
    assert {"postgresql.md", "other-sources.md"} <= names, names


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: p.name)
def test_runnable_example(page, tmp_path):
    """Every runnable block of the page, in order, in one scratch directory."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    for block in runnable_blocks(page):
        if block.title:
            (tmp_path / block.title).write_text(block.text, encoding="utf-8")
            continue
        proc = subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + block.text],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, f"{block.id} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"


def test_cli_reference_is_current():
    """``docs/reference/cli.md`` shows the parser as it is (run ``python scripts/cli_reference.py``)."""
    check = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr


def test_errors_page_covers_every_error_class():
    """The operations page gives each error class its next step, and names no class that is gone."""
    from airflow_cdc.core import errors
    from airflow_cdc.core.state import StateCorrupt

    classes = {
        name for name, obj in inspect.getmembers(errors, inspect.isclass)
        if issubclass(obj, errors.CdcError) and obj is not errors.CdcError
    } | {StateCorrupt.__name__}  # fmt: skip
    page = (DOCS / "operations" / "errors.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `(\w+)` \|", page, re.M))
    assert rows == classes, f"missing: {sorted(classes - rows)}, unknown: {sorted(rows - classes)}"


def test_readme_is_a_page_and_links_into_the_site():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    assert "make demo" in readme and "make test" in readme
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    assert links and all((ROOT / link).is_file() for link in links), links
