"""The per-connector lease: refusal naming the holder, takeover of dead/expired holders, fencing.

Runs against every state-store backend (file, sqlite, Airflow Variables through an in-memory
key-value store) and, through a fake source, against Capture itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from airflow_cdc.airflow.state_variable import VariableStateStore
from airflow_cdc.core.batch import Batch, list_batches
from airflow_cdc.core.capture import Capture
from airflow_cdc.core.errors import ConfigError, LeaseHeld, LeaseLost
from airflow_cdc.core.lease import acquire, fence_state
from airflow_cdc.core.pipeline import build_config
from airflow_cdc.core.source import ChangeSource
from airflow_cdc.core.state import open_state_store
from airflow_cdc.core.state_file import FileStateStore
from airflow_cdc.sources.postgres.position import format_pg_lsn

ROOT = Path(__file__).resolve().parents[3]


def _variable_store(tmp_path: Path) -> VariableStateStore:
    data: dict[str, str] = {}
    return VariableStateStore(get=data.get, put=data.__setitem__, delete=data.pop)


STORES = {
    "file": lambda tmp: FileStateStore(tmp / "state"),
    "sqlite": lambda tmp: open_state_store(f"sqlite:///{tmp / 'state.db'}"),
    "variable": _variable_store,
}


@pytest.fixture(params=sorted(STORES))
def store(request, tmp_path):
    return STORES[request.param](tmp_path)


def _expire(store, connector: str) -> None:
    """Make the current lease look unrenewed for longer than its timeout (a hung or killed run)."""
    leases = store.lease_store()
    stored = leases.load(connector)
    leases.compare_and_set(connector, stored.version, {**stored.data, "expires_at": time.time() - 1})


def test_second_holder_refused_naming_the_first(store):
    first = acquire(store, "shop", "capture", 30)
    try:
        with pytest.raises(LeaseHeld) as err:
            acquire(store, "shop", "apply", 30)
        text = str(err.value)
        assert f"capture on host {socket.gethostname()}, pid {os.getpid()}, since 20" in text
        assert err.value.retryable and "retry" in err.value.hint
        other = acquire(store, "other", "capture", 30)
        assert other.token == 1  # per connector
        other.release()
    finally:
        first.release()
    second = acquire(store, "shop", "apply", 30)
    assert second.token == first.token + 1  # tokens only grow, across releases too
    second.release()


def test_expired_lease_is_taken_over_and_the_old_holder_is_fenced(store):
    old = acquire(store, "shop", "apply", 30)
    old._stop.set()  # a run that hangs: it no longer renews
    holder = store.lease_store().load("shop").data["holder"]
    store.lease_store().compare_and_set(
        "shop",
        store.lease_store().load("shop").version,
        {"token": old.token, "holder": {**holder, "host": "elsewhere"}, "expires_at": time.time() + 30},
    )
    with pytest.raises(LeaseHeld, match="elsewhere"):  # another host: no pid check, wait for expiry
        acquire(store, "shop", "capture", 30)
    _expire(store, "shop")
    new = acquire(store, "shop", "capture", 30)
    assert new.token == old.token + 1
    with pytest.raises(LeaseLost, match="taken over"):
        old.check()
    committed = fence_state(new, None, {"offset": 2})
    assert committed == {"offset": 2, "fence": new.token}
    with pytest.raises(LeaseLost, match="newer than this run's"):
        fence_state(old, committed, {"offset": 1})  # a stale apply's commit never lands
    new.release()
    old.release()  # no longer its lease: releasing must not clear the new holder's record
    assert store.lease_store().load("shop").data["token"] == new.token


def test_renewal_keeps_a_long_run_alive(store):
    lease = acquire(store, "shop", "capture", 0.3)
    time.sleep(0.9)  # three timeouts: only the renewal thread keeps it
    with pytest.raises(LeaseHeld):
        acquire(store, "shop", "commit", 0.3)
    lease.check()
    lease.release()


def test_same_host_name_other_pid_space_is_not_provably_dead():
    from airflow_cdc.core.lease import Holder

    me = Holder.me("capture")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert Holder(me.host, gone.pid, "r", "capture", me.since, me.pidns).provably_dead()
    assert not Holder(me.host, gone.pid, "r", "capture", me.since, "elsewhere").provably_dead()
    assert not Holder("other-host", gone.pid, "r", "capture", me.since, me.pidns).provably_dead()
    assert not Holder(me.host, os.getpid(), "r", "capture", me.since, me.pidns).provably_dead()


def test_sigkilled_holder_is_taken_over_at_once(tmp_path):
    state = tmp_path / "state"
    code = textwrap.dedent(
        f"""
        import sys, time
        from airflow_cdc.core.lease import acquire
        from airflow_cdc.core.state_file import FileStateStore
        acquire(FileStateStore({str(state)!r}), "shop", "capture", 3600)
        print("held", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        store = FileStateStore(state)
        with pytest.raises(LeaseHeld, match=f"pid {proc.pid}"):
            acquire(store, "shop", "capture", 3600)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    lease = acquire(store, "shop", "capture", 3600)  # its pid is gone on this host: no waiting an hour
    assert lease.token == 2
    lease.release()


# -- Capture, through a fake source -------------------------------------------------------------


@dataclass
class Window:
    end_lsn: int
    events: int = 0
    messages: int = 0
    last_commit_lsn: int | None = None
    per_table: dict = field(default_factory=dict)
    manifest_extra: dict = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.end_lsn


class FakeSource(ChangeSource):
    """Just enough of a change source: an empty window from a counter; optional pause inside it."""

    kind = "postgresql"

    def __init__(self, pause: threading.Event | None = None, inside: threading.Event | None = None) -> None:
        self.pause, self.inside = pause, inside
        self.opened = 0
        self.acknowledged: list = []
        self.head_lsn = 100

    def open(self):
        self.opened += 1

    def close(self):
        pass

    def heartbeat(self):
        pass

    def tables(self):
        return []

    def start_offset(self, offset, when_needed):
        return (int(offset["lsn"].split("/")[1], 16) if offset else 0), None

    def head(self):
        return self.head_lsn

    def offset_at(self, end, window, previous):
        return {"lsn": format_pg_lsn(end)}

    def describe_offset(self, offset):
        return str(offset)

    def changes_after(self, offset, check=None):
        return True

    def position_floor(self):
        return b"\0" * 20

    def write_purge(self, writer, table, position, end):
        raise AssertionError("no purge expected")

    def read_window(self, from_lsn, upto_lsn, writer, tracker, max_events):
        if self.inside is not None:
            self.inside.set()
        if self.pause is not None:
            assert self.pause.wait(30)
        return Window(upto_lsn)

    def reflects(self, watermark, txn):
        return True

    def acknowledge(self, offset):
        self.acknowledged.append(offset)


def _capture(tmp_path, source, **props) -> Capture:
    config = build_config(
        {"name": "shop", "connector": "postgresql", "staging.path": str(tmp_path / "staging"), **props}
    )
    return Capture(source, config, FileStateStore(tmp_path / "staging" / "_state"))


def test_concurrent_capture_refused_and_first_batch_intact(tmp_path):
    pause, inside = threading.Event(), threading.Event()
    first = _capture(tmp_path, FakeSource(pause, inside))
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("result", first.run()))
    thread.start()
    try:
        assert inside.wait(30)  # the first capture is inside its window, batch directory open
        second_source = FakeSource()
        with pytest.raises(LeaseHeld) as err:
            _capture(tmp_path, second_source).run()
        assert f"capture on host {socket.gethostname()}, pid {os.getpid()}" in str(err.value)
        assert second_source.opened == 0  # refused before touching the source (no slot wait/terminate)
        with pytest.raises(LeaseHeld):
            _capture(tmp_path, FakeSource()).commit(Batch.__new__(Batch))  # nor may anyone commit
    finally:
        pause.set()
        thread.join(30)
    batch = Batch(out["result"].batch_path)  # the first capture's batch was not cleaned away
    batch.verify()
    assert first.commit(batch) == 1


def test_stale_holder_cannot_commit_after_takeover(tmp_path):
    old_source, new_source = FakeSource(), FakeSource()
    old, new = _capture(tmp_path, old_source), _capture(tmp_path, new_source)
    batch = Batch(old.run().batch_path)
    with old.leases.hold("apply") as lease:  # e.g. `airflow-cdc apply --commit`, then it hangs
        lease._stop.set()
        _expire(old.store, "shop")
        new_source.head_lsn = 200
        assert new.run(commit=True).committed  # a newer run takes over and commits
        with pytest.raises(LeaseLost, match="taken over"):
            old.commit(batch)
    stored = old.store.load("shop")
    assert stored.version == 1 and stored.data["fence"] == 3 and stored.data["offset"]["lsn"] == "0/C8"
    assert old_source.acknowledged == []  # the source was never told the stale offset


def test_stale_commit_refused_by_the_state_fence(tmp_path):
    """Even when the lease check passes (a stale lease record rewritten), the state's fence refuses."""
    capture = _capture(tmp_path, FakeSource())
    batch = Batch(capture.run().batch_path)
    store = capture.store
    store.compare_and_set("shop", None, {"fence": 99, "offset": {"lsn": "0/0"}})
    with pytest.raises(LeaseLost, match="lease token 99"):
        capture.commit(batch)
    assert store.load("shop").data["fence"] == 99


def test_a_state_another_kind_of_source_wrote_is_refused_before_anything_moves(tmp_path):
    first = _capture(tmp_path, FakeSource())
    first.commit(Batch(first.run().batch_path))
    before = FileStateStore(tmp_path / "staging" / "_state").load("shop")

    class MariaDbSource(FakeSource):
        kind = "mysql"

    other = MariaDbSource()
    with pytest.raises(ConfigError) as err:
        _capture(tmp_path, other).run()
    assert "state 'shop' was written by a postgresql connector, and this pipeline is mysql" in str(err.value)
    assert "give this pipeline its own name" in err.value.hint
    assert FileStateStore(tmp_path / "staging" / "_state").load("shop") == before
    assert len(list_batches(str(tmp_path / "staging"), "shop")) == 1
