"""Source-independent test helpers: run a capture, replay staged batches, compare with the source."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Self

from airflow_cdc.core.batch import list_batches
from airflow_cdc.core.pipeline import build_capture, build_config, build_store
from tests.support.oracle import ReferenceApplier, frozen


def run_capture(config: dict[str, Any], commit: bool = True, signals: list | None = None) -> Any:
    return build_capture(config).run(signals=signals, commit=commit)


def replay(config: dict[str, Any]) -> ReferenceApplier:
    oracle = ReferenceApplier()
    oracle.apply_batches(list_batches(config["staging.path"], config["name"]))
    return oracle


def assert_rows_equal(
    table: str,
    expected: dict[tuple, dict[str, Any]],
    got: dict[tuple, dict[str, Any]],
    lenient_columns: bool = False,
) -> None:
    """Compare keyed rows.  With ``lenient_columns`` only the source's current columns count and a
    column a replayed row lacks is NULL: ``ADD COLUMN`` / ``DROP COLUMN`` write no row events."""
    if lenient_columns:
        got = {k: {c: (v or {}).get(c) for c in (expected.get(k) or v)} for k, v in got.items()}
    missing = expected.keys() - got.keys()
    extra = got.keys() - expected.keys()
    wrong = [k for k in expected.keys() & got.keys() if expected[k] != got[k]]
    assert not missing and not extra and not wrong, (
        f"{table}: {len(missing)} missing, {len(extra)} extra, {len(wrong)} different of {len(expected)}; "
        f"e.g. missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}, "
        f"different {[(k, _diff(expected[k], got[k])) for k in wrong[:3]]}"
    )


def assert_multiset_equal(table: str, expected: list[dict[str, Any]], got: list[dict[str, Any]]) -> None:
    """Compare the rows of a table without key as multisets (duplicates count)."""
    want, have = Counter(map(_frozen, expected)), Counter(map(_frozen, got))
    missing, extra = want - have, have - want
    assert not missing and not extra, (
        f"{table}: {sum(missing.values())} missing, {sum(extra.values())} extra of {len(expected)} rows; "
        f"e.g. missing {[_short(dict(r)) for r in list(missing)[:3]]}, "
        f"extra {[_short(dict(r)) for r in list(extra)[:3]]}"
    )


def _frozen(row: dict[str, Any]) -> tuple:
    return tuple(sorted((k, frozen(v)) for k, v in row.items()))


def _diff(expected: dict[str, Any] | None, got: dict[str, Any] | None) -> dict[str, tuple[str, str]]:
    """The differing columns of two rows as (expected, got), long values shortened."""
    if expected is None or got is None:
        return {"(row)": (_short(expected), _short(got))}
    cols = expected.keys() | got.keys()
    return {
        c: (_short(expected.get(c)), _short(got.get(c)))
        for c in sorted(cols)
        if expected.get(c) != got.get(c)
    }


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}...({len(text)} chars)"


def snapshot_pending(config: dict[str, Any]) -> bool:
    """Whether the committed state still has a table snapshot to do (or nothing is committed)."""
    stored = build_store(build_config(config)).load(config["name"])
    return stored is None or bool(stored.data["snapshot"]["pending"])


def capture_process(config_path: Path, failpoints: str) -> subprocess.Popen:
    """``airflow-cdc capture --commit`` in a child process (to be SIGKILLed), with failpoints armed."""
    env = dict(os.environ, AIRFLOW_CDC_FAILPOINTS=failpoints, PYTHONFAULTHANDLER="1")
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_cdc.cli", "capture", "--config", str(config_path), "--commit"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


class CrashRuns:
    """Capture runs in child processes for a crash-convergence loop: each run is armed with
    ``failpoints`` and, at ``kill_rate``, SIGKILLed after a random delay of up to ``max_delay``
    seconds -- until ``budget`` runs were killed; later runs go unarmed.  Without the budget the
    loop may never end on a slow machine: a slow run lets the writers fill its window, and a
    per-transaction failpoint (``mid_window``) then kills nearly every run."""

    def __init__(
        self,
        config_path: Path,
        failpoints: str,
        rng: random.Random,
        kill_rate: float,
        max_delay: float,
        budget: int = 30,
        max_runs: int = 400,
    ) -> None:
        self.config_path, self.failpoints, self.rng = config_path, failpoints, rng
        self.kill_rate, self.max_delay, self.budget, self.max_runs = kill_rate, max_delay, budget, max_runs
        self.kills = self.clean = 0

    @property
    def runs(self) -> int:
        return self.kills + self.clean

    @property
    def armed(self) -> bool:
        return self.kills < self.budget

    def start(self) -> subprocess.Popen:
        return capture_process(self.config_path, self.failpoints if self.armed else "")

    def maybe_kill(self, proc: subprocess.Popen) -> None:
        if self.armed and self.rng.random() < self.kill_rate:
            time.sleep(self.rng.random() * self.max_delay)
            proc.send_signal(signal.SIGKILL)

    def wait(self, proc: subprocess.Popen) -> None:
        """Count the run; a run that failed otherwise or hung fails the test with its stderr."""
        try:
            _, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: the child's stacks on stderr
            _, err = proc.communicate()
            raise AssertionError(f"capture hung (run {self.runs}): {err.decode()[-6000:]}") from None
        if proc.returncode == 0:
            self.clean += 1
        elif proc.returncode == -signal.SIGKILL:
            self.kills += 1
        else:
            raise AssertionError(f"capture failed ({proc.returncode}): {err.decode()[-3000:]}")
        assert self.runs < self.max_runs, f"no progress: {self.kills} kills, {self.clean} clean runs"

    def run(self) -> None:
        proc = self.start()
        self.maybe_kill(proc)
        self.wait(proc)


class WriterThreads:
    """Background writer threads run as a context: started on entry, stopped and joined on exit.

    Subclasses fill ``threads`` (daemon threads watching ``stop``) in their ``__init__``.
    """

    join_timeout = 30.0

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def __enter__(self) -> Self:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=self.join_timeout)
