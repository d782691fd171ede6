"""FileStateStore: round trip, compare-and-set, crash safety and cross-process races."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import subprocess
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest

from airflow_cdc.core.errors import StateConflict
from airflow_cdc.core.state import StateCorrupt, StateStore, StoredState, open_state_store
from airflow_cdc.core.state_file import FileStateStore, file_stem

ROOT = Path(__file__).resolve().parents[3]


def test_round_trip_and_versions(tmp_path: Path) -> None:
    store = FileStateStore(tmp_path / "state")
    assert isinstance(store, StateStore)
    assert store.load("pg1") is None
    state = {"offset": {"lsn": "0/16B3748", "txid": 12}, "snapshot": {"done": ["public.a"]}, "ü": "ß"}
    assert store.compare_and_set("pg1", None, state) == 1
    loaded = store.load("pg1")
    assert isinstance(loaded, StoredState)
    assert (loaded.version, loaded.data) == (1, state)
    assert datetime.fromisoformat(loaded.updated_at).utcoffset().total_seconds() == 0
    assert store.compare_and_set("pg1", 1, {"offset": 2}) == 2
    assert store.load("pg1") == StoredState(2, {"offset": 2}, store.load("pg1").updated_at)
    text = (tmp_path / "state" / "pg1.json").read_text()
    assert text.startswith("{\n  ") and json.loads(text)["connector"] == "pg1"
    assert store.describe() == f"file:{tmp_path / 'state'}"


def test_conflicts_leave_state_unchanged(tmp_path: Path) -> None:
    store = FileStateStore(tmp_path)
    store.compare_and_set("c", None, {"n": 1})
    with pytest.raises(StateConflict):
        store.compare_and_set("c", None, {"n": "dup"})
    with pytest.raises(StateConflict):
        store.compare_and_set("c", 7, {"n": "stale"})
    store.compare_and_set("c", 1, {"n": 2})
    with pytest.raises(StateConflict):
        store.compare_and_set("c", 1, {"n": "lost race"})
    assert store.load("c").data == {"n": 2}
    assert StateConflict("x").retryable


def test_delete(tmp_path: Path) -> None:
    store = FileStateStore(tmp_path)
    store.delete("never")
    store.compare_and_set("c", None, {"n": 1})
    store.delete("c")
    assert store.load("c") is None
    with pytest.raises(StateConflict):
        store.compare_and_set("c", 1, {"n": 2})
    assert store.compare_and_set("c", None, {"n": 3}) == 1


@pytest.mark.parametrize("name", ["a/b", "../escape", ".hidden", "..", "a%2Fb", "x y\nz", "ü€😀", "n" * 255])
def test_connector_names_are_escaped(tmp_path: Path, name: str) -> None:
    store = FileStateStore(tmp_path / "s")
    store.compare_and_set(name, None, {"name": name})
    store.compare_and_set("a/b" if name != "a/b" else "other", None, {"other": True})
    assert store.load(name).data == {"name": name}
    assert list(tmp_path.iterdir()) == [tmp_path / "s"]
    for entry in (tmp_path / "s").iterdir():
        assert not entry.name.startswith(".") and len(entry.name.encode()) < 255


def test_file_stem_is_injective() -> None:
    names = ["a/b", "a%2Fb", "a%2fb", ".x", "%2Ex", "x" * 300, "x" * 299 + "y"]
    stems = [file_stem(n) for n in names]
    assert len(set(stems)) == len(stems)


@pytest.mark.parametrize("bad", ["", "x" * 256, "nul\x00"])
def test_invalid_connector_names(tmp_path: Path, bad: str) -> None:
    from airflow_cdc.core.errors import ConfigError

    with pytest.raises(ConfigError):
        FileStateStore(tmp_path).load(bad)


@pytest.mark.parametrize("data", [["not", "a", "dict"], {"x": float("nan")}, {"x": object()}])
def test_non_json_state_is_rejected_before_writing(tmp_path: Path, data: object) -> None:
    store = FileStateStore(tmp_path)
    store.compare_and_set("c", None, {"ok": 1})
    with pytest.raises(TypeError):
        store.compare_and_set("c", 1, data)  # type: ignore[arg-type]
    assert store.load("c").data == {"ok": 1}
    with pytest.raises(TypeError):
        store.compare_and_set("c", True, {"ok": 2})  # type: ignore[arg-type]


def test_failed_rename_keeps_old_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileStateStore(tmp_path)
    store.compare_and_set("c", None, {"n": 1})

    def boom(src: object, dst: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        store.compare_and_set("c", 1, {"n": 2})
    monkeypatch.undo()
    assert store.load("c").data == {"n": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "c.lock"]  # no temp file left
    assert store.compare_and_set("c", 1, {"n": 2}) == 2


def test_corrupt_file_is_reported(tmp_path: Path) -> None:
    store = FileStateStore(tmp_path)
    (tmp_path / "c.json").write_text('{"connector": "c", "version": 1, "state": {"x"')
    with pytest.raises(StateCorrupt):
        store.load("c")


_CRASH_WRITER = textwrap.dedent("""
    import sys
    from airflow_cdc.core.state_file import FileStateStore
    store = FileStateStore(sys.argv[1])
    while True:
        cur = store.load("crash")
        version = cur.version if cur else None
        n = (version or 0) + 1
        store.compare_and_set("crash", version, {"n": n, "blob": str(n) * 200_000})
""")


def test_sigkill_mid_write_never_tears_state(tmp_path: Path) -> None:
    rng = random.Random(1234)
    store = FileStateStore(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    last_version = 0
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", _CRASH_WRITER, str(tmp_path)], env=env)
        try:
            deadline = time.monotonic() + 30
            while (cur := store.load("crash")) is None or cur.version <= last_version:
                assert time.monotonic() < deadline and proc.poll() is None, "writer made no progress"
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.05))
        finally:
            proc.kill()
            proc.wait()
        state = store.load("crash")
        assert state is not None and state.data["n"] == state.version >= last_version
        assert state.data["blob"] == str(state.version) * 200_000
        last_version = state.version
    assert store.compare_and_set("crash", last_version, {"n": 0}) == last_version + 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # crash leftovers cleaned


def _race_worker(
    directory: str,
    me: int,
    rounds: int,
    barrier: multiprocessing.synchronize.Barrier,
    results: multiprocessing.queues.Queue,
) -> None:
    store = FileStateStore(directory)
    wins: list[int] = []
    try:
        for r in range(rounds):
            barrier.wait()
            try:
                store.compare_and_set("race", r or None, {"round": r, "winner": me})
                wins.append(r)
            except StateConflict:
                pass
            barrier.wait()
    except BaseException as exc:  # report instead of leaving the others waiting
        barrier.abort()
        results.put((me, repr(exc)))
        return
    results.put((me, wins))


def test_processes_racing_exactly_one_wins_each_round(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    workers, rounds = 4, 20
    barrier, results = ctx.Barrier(workers, timeout=60), ctx.Queue()
    procs = [
        ctx.Process(target=_race_worker, args=(str(tmp_path), i, rounds, barrier, results), daemon=True)
        for i in range(workers)
    ]
    try:
        for p in procs:
            p.start()
        outcome = dict(results.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    errors = {me: res for me, res in outcome.items() if isinstance(res, str)}
    assert not errors
    per_round = [sum(r in wins for wins in outcome.values()) for r in range(rounds)]
    assert per_round == [1] * rounds
    final = FileStateStore(tmp_path).load("race")
    assert final.version == rounds and final.data["round"] == rounds - 1
    assert rounds - 1 in outcome[final.data["winner"]]


def test_open_state_store_file_urls(tmp_path: Path) -> None:
    for url in (f"file://{tmp_path}/a", str(tmp_path / "b"), f"file://localhost{tmp_path}/c"):
        store = open_state_store(url)
        assert isinstance(store, FileStateStore)
        store.compare_and_set("c", None, {"u": url})
    assert {p.name for p in tmp_path.iterdir()} == {"a", "b", "c"}


def test_open_state_store_sqlite_and_errors(tmp_path: Path) -> None:
    from airflow_cdc.core.errors import ConfigError

    store = open_state_store(f"sqlite://{tmp_path}/s.db?table=my%20state")
    assert store.compare_and_set("c", None, {"x": 1}) == 1
    assert open_state_store(f"sqlite://{tmp_path}/s.db?table=my%20state").load("c").data == {"x": 1}
    assert "my state" in store.describe()
    for bad in ("", "ftp://x/y", "file://otherhost/x", "sqlite://:memory:"):
        with pytest.raises(ConfigError):
            open_state_store(bad)
