"""The real-Vitess test cluster looks for the binaries where ``make vitess`` builds them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from airflow_cdc.testing import vitess_real

ROOT = Path(__file__).resolve().parents[3]


def test_the_cluster_looks_where_the_makefile_builds(monkeypatch):
    text = (ROOT / "Makefile").read_text()
    assert re.search(r"^VITESS_VERSION\s*:=\s*(\S+)$", text, re.M).group(1) == vitess_real.VITESS_VERSION
    assert re.search(r"^setup:.*\bvitess\b", text, re.M), "make setup builds Vitess"
    monkeypatch.delenv("VITESS_DIR", raising=False)
    folder = subprocess.run(
        ["make", "-s", "--no-print-directory", "vitess-dir"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    monkeypatch.delenv(vitess_real.VITESS_BIN_ENV, raising=False)
    assert vitess_real.vitess_bin() == Path(folder) / "bin"
    monkeypatch.setenv(vitess_real.VITESS_BIN_ENV, "/opt/vt")
    assert vitess_real.vitess_bin() == Path("/opt/vt")
