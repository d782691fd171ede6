"""Convergence on a two-shard keyspace: a copy-phase snapshot spread over many runs while writers
insert, update and delete on both shards, capture processes SIGKILLed at random points (before and
after the commit, mid-window); the replay of every published batch equals the union of the shards."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pymysql
import pytest

from tests.integration.vitess.capture_support import SCHEMA, order_values, shard_rows, vitess_props
from tests.support.pipeline import (
    CrashRuns,
    WriterThreads,
    assert_rows_equal,
    replay,
    run_capture,
    snapshot_pending,
)

pytestmark = pytest.mark.slow
INSERT = "INSERT INTO orders VALUES (%s, %s, %s, %s, %s, %s, %s)"
KEYS = 400


class Writers(WriterThreads):
    """Two threads changing random keys on whichever shard owns them, until stopped."""

    def __init__(self, vtgate, keyspace: str) -> None:
        self.vtgate, self.keyspace = vtgate, keyspace
        super().__init__()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(seed,), daemon=True) for seed in (1, 2)]

    def _run(self, seed: int) -> None:
        rng, version = random.Random(seed), 0
        try:
            while not self.stop.is_set():
                key, action, version = rng.randrange(1, KEYS), rng.random(), version + 1
                if action < 0.4:
                    self.vtgate.execute(
                        self.keyspace,
                        INSERT + " ON DUPLICATE KEY UPDATE item = VALUES(item), at = VALUES(at)",
                        order_values(key, version),
                        key=key,
                    )
                elif action < 0.8:
                    self.vtgate.execute(
                        self.keyspace, "UPDATE orders SET qty = qty - 1, raw = %s WHERE id = %s",
                        (bytes([version % 256]), key), key=key,
                    )  # fmt: skip
                else:
                    self.vtgate.execute(self.keyspace, "DELETE FROM orders WHERE id = %s", (key,), key=key)
                time.sleep(rng.random() * 0.01)
        except pymysql.MySQLError as e:
            self.errors.append(e)


def sigkill_scenario(
    vtgate, shard_servers, keyspace: str, tmp_path: Path, reshard_at: int | None = None
) -> dict:
    """Two shards, 300 rows, writers running; capture processes (committing) SIGKILLed at random
    points until the copy is done and three runs went through; then drained.  Returns the props.

    :param reshard_at: merge the two shards into one (``-80``, ``80-`` -> ``0``, the way a Reshard
        workflow ends: journal on the old shards, new shard set in the VGTID) while capture run
        number ``reshard_at`` is running, with the copy still unfinished and writers writing.
    """
    ks = keyspace
    vtgate.add_keyspace(ks, {"-80": shard_servers[1], "80-": shard_servers[2]}, SCHEMA)
    for i in range(1, 301):
        vtgate.execute(ks, INSERT, order_values(i), key=i)
    props = vitess_props(vtgate, ks, tmp_path / "staging", **{"run.max.events": 60})
    config_path = tmp_path / "pipeline.json"
    config_path.write_text(json.dumps(props))
    rng = random.Random(7)
    runs = CrashRuns(
        config_path, "after_batch_write:0.25,after_state_commit:0.2,mid_window:0.1", rng, 0.3, 1.5
    )
    copy_runs = 0
    with Writers(vtgate, ks) as writers:
        while snapshot_pending(props) or runs.clean < 3:
            copy_runs += snapshot_pending(props)
            proc = runs.start()
            if runs.runs + 1 == reshard_at:
                assert snapshot_pending(props), "the reshard should come while the copy is unfinished"
                time.sleep(rng.random() * 0.5)
                vtgate.reshard(ks, {"0": shard_servers[0]})
            else:
                runs.maybe_kill(proc)
            runs.wait(proc)
    assert not writers.errors
    assert runs.kills >= 5, f"only {runs.kills} kills happened"
    assert copy_runs >= 5, "the copy should be spread over many runs"
    assert reshard_at is None or [s.name for s in vtgate.keyspace_shards(ks)] == ["0"]
    while run_capture(props).events:
        pass
    return props


def test_two_shards_merged_mid_copy_converge_with_sigkills(vtgate, shard_servers, keyspace, tmp_path):
    """The two-shard scenario without a reshard runs against real Vitess, through Spark
    (``test_real_vitess_convergence.py``); a reshard can only be emulated here."""
    props = sigkill_scenario(vtgate, shard_servers, keyspace, tmp_path, reshard_at=2)
    oracle = replay(props)
    expected = shard_rows(vtgate, keyspace)
    assert len(expected) > 150
    assert_rows_equal("orders", expected, oracle.rows(f"{keyspace}.orders"))
