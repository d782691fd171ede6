"""A real Airflow 3 deployment on loopback -- api-server, scheduler (LocalExecutor), dag-processor and
triggerer, metadata in PostgreSQL -- driven through its UI in headless Chromium (Debian's, by
playwright) and through the scheduler, not ``airflow dags test``:

* the trigger form starts a plain run (no field filled) and a one-table snapshot (only the tables
  field), and both runs do what they say; the connection list's *Test* button reports a good and a
  bad ``cdcpostgres`` Connection;
* the sensor defers to the triggerer, which resumes it when a row changes; a no-change period ends
  with the sensor skipped, no capture, no batch and no commit (so no Asset event);
* the plugin's CDC tab on the DAG page shows the lag, retained WAL and snapshot progress of
  ``status --json`` (last: it leaves a snapshot pending).

Apply is off in this DAG (``apply: false``): Spark is covered by the other end-to-end tests; here the
subject is the Airflow components.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from airflow_cdc.core.batch import list_batches
from airflow_cdc.testing.servers import free_port
from tests.airflow.support import batch_rows, load_shop

pytestmark = pytest.mark.slow
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
CHROMIUM = "/usr/bin/chromium"
DAG = "live_shop"
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")


class LiveAirflow:
    """The four components as subprocesses of one AIRFLOW_HOME, and helpers to query them."""

    def __init__(self, home: Path, env: dict[str, str], port: int) -> None:
        self.home, self.env, self.port = home, env, port
        self.url = f"http://127.0.0.1:{port}"
        self.procs: dict[str, subprocess.Popen] = {}

    def cli(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} failed: {proc.stdout[-2000:]}{proc.stderr[-3000:]}")
        return proc.stdout

    def start(self) -> None:
        self.cli("db", "migrate")
        for name in COMPONENTS:
            log = (self.home / f"{name}.log").open("w")
            self.procs[name] = subprocess.Popen(
                [AIRFLOW, name], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.healthy():
                return
            time.sleep(2)
        raise AssertionError(f"Airflow did not become healthy:\n{self.logs()}")

    def healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as r:
                health = json.load(r)
        except OSError:
            return False
        parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
        return all((health.get(p) or {}).get("status") == "healthy" for p in parts)

    def stop(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def logs(self, tail: int = 3000, run_id: str | None = None) -> str:
        """The components' log tails, and with ``run_id`` the tail of each of that run's task logs
        (``logs/dag_id=…/run_id=…/task_id=…/attempt=N.log``): why a task failed."""
        parts = [f"--- {n}:\n{(self.home / f'{n}.log').read_text(errors='replace')[-tail:]}" for n in COMPONENTS]
        if run_id is not None:
            for log in sorted((self.home / "logs").glob(f"dag_id={DAG}/run_id={run_id}/task_id=*/attempt=*.log")):
                parts.append(f"--- task {log.parent.name} {log.name}:\n{log.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def runs(self) -> list[dict[str, Any]]:
        return _json_list(self.cli("dags", "list-runs", DAG, "-o", "json"))

    def task_states(self, run_id: str) -> dict[str, str]:
        out = self.cli("tasks", "states-for-dag-run", DAG, run_id, "-o", "json")
        return {t["task_id"]: t["state"] for t in _json_list(out)}

    def wait_run(self, run_id: str, timeout: float = 240) -> dict[str, str]:
        """Task states once the run finished (success or failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = next((r for r in self.runs() if r["run_id"] == run_id), None)
            if run is not None and run["state"] in ("success", "failed"):
                states = self.task_states(run_id)
                assert run["state"] == "success", f"run {run_id} {run['state']}: {states}\n{self.logs(run_id=run_id)}"
                return states
            time.sleep(2)
        raise AssertionError(f"run {run_id} did not finish in {timeout:.0f}s\n{self.logs()}")

    def wait_new_run(self, before: set[str], timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            new = [r["run_id"] for r in self.runs() if r["run_id"] not in before]
            if new:
                return new[0]
            time.sleep(1)
        raise AssertionError(f"no new run of {DAG}\n{self.logs()}")


def _json_list(out: str) -> list[dict[str, Any]]:
    """The JSON list a CLI command printed (after any warning lines)."""
    for line in reversed(out.splitlines()):
        if line.startswith("["):
            try:
                return list(json.loads(line))
            except ValueError:
                continue
    return []


@pytest.fixture(scope="module")
def live(pg_server, tmp_path_factory) -> Iterator[tuple[LiveAirflow, Any]]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is missing: make setup installs it")
    home = tmp_path_factory.mktemp("live_airflow")
    meta, shop = f"af_{uuid.uuid4().hex[:8]}", f"shop_{uuid.uuid4().hex[:8]}"
    pg_server.create_database(meta)
    pg_server.create_database(shop)
    db = type("Db", (), {"name": shop, "server": pg_server, "dsn": pg_server.dsn(shop)})()
    db.connect = lambda **kw: __import__("psycopg").connect(db.dsn, **kw)
    load_shop(db)
    auth = f"{pg_server.superuser}:{pg_server.password}@{pg_server.host}:{pg_server.port}"
    port = free_port()
    dags = home / "dags"
    dags.mkdir()
    pipeline = dags / "shop.yaml"
    pipeline.write_text(
        f"name: {DAG}\nconnector: postgresql\ntable.include.list: public.customers,public.orders\n"
        f"slot.name: {shop}\npublication.name: {shop}_pub\nstaging.path: {home / 'staging'}\n"
        f"state.store: postgresql://{auth}/{meta}?table=cdc_state\n"  # not the source DB: its writes would be changes

        f"airflow:\n  dag_id: {DAG}\n  cdc_conn_id: live_pg\n  apply: false\n  retries: 0\n"
        # the deferral must outlast the test's state polls (CLI calls of seconds each on a busy
        # machine: a CI run saw a 20 s deferral time out unseen)
        "  deferrable: true\n  poke_interval: 2\n  sensor_timeout: 60\n"
    )
    (dags / "live_shop.py").write_text(
        f"from airflow_cdc.airflow.dag_factory import cdc_dag\ndag = cdc_dag({str(pipeline)!r})\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_"))}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg://{auth}/{meta}",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": f"postgresql+psycopg://{auth}/{meta}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__AUTH_MANAGER":
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex * 2,
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
    })  # fmt: skip
    af = LiveAirflow(home, env, port)
    try:
        af.start()
        conn = {"conn_type": "cdcpostgres", "host": pg_server.host, "port": pg_server.port,
                "login": pg_server.superuser, "password": pg_server.password, "schema": shop}  # fmt: skip
        af.cli("connections", "add", "live_pg", "--conn-json", json.dumps(conn))
        bad = {**conn, "password": "wrong-password"}
        af.cli("connections", "add", "live_pg_bad", "--conn-json", json.dumps(bad))
        deadline = time.monotonic() + 120
        while DAG not in af.cli("dags", "list", "-o", "plain", check=False):
            assert time.monotonic() < deadline, f"DAG not parsed\n{af.logs()}"
            time.sleep(2)
        af.cli("dags", "unpause", DAG)
        yield af, db
    finally:
        af.stop()
        shutil.rmtree(home / "staging", ignore_errors=True)


def _browser():
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    return pw, browser


#: the docs' Airflow pages show these (docs/airflow/*.md): each PNG is rewritten only by a run that got
#: past what it shows (taken into memory, written after the asserts of that step)
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "assets" / "screenshots"


def _save_screenshots(shots: dict[str, bytes]) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    for name, png in shots.items():
        (SCREENSHOTS / name).write_bytes(png)
    shots.clear()


def _trigger_from_form(af: LiveAirflow, page, tables: str | None, shots: dict[str, bytes] | None = None) -> str:
    before = {r["run_id"] for r in af.runs()}
    page.goto(f"{af.url}/dags/{DAG}", wait_until="networkidle")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.locator("[role=dialog][data-state=open]")
    dialog.get_by_role("button", name="Ad hoc snapshot").click()
    if tables:
        dialog.locator("#element_snapshot_tables").fill(tables)
    if shots is not None:
        shots["trigger_form.png"] = page.screenshot()
    dialog.get_by_role("button", name="Trigger").last.click()
    return af.wait_new_run(before)


def test_trigger_form_and_connection_test_in_a_browser(live):
    af, db = live
    staging = af.home / "staging"
    pw, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        shots: dict[str, bytes] = {}
        plain = _trigger_from_form(af, page, None)
        states = af.wait_run(plain)
        assert states["capture"] == "success" and states["commit"] == "success", states
        batches = list_batches(staging, DAG)
        assert len(batches) == 1 and batches[0].manifest["counts"]["snapshot_rows"] == 450  # initial snapshot
        page.goto(f"{af.url}/dags/{DAG}/runs/{quote(plain, safe='')}", wait_until="networkidle")
        page.get_by_title("Show Graph (Press g)").click()
        page.locator(".react-flow__node").nth(2).wait_for()  # sense, capture, commit laid out
        shots["pipeline_run_graph.png"] = page.screenshot()
        _save_screenshots(shots)

        snap = _trigger_from_form(af, page, "public.customers", shots)
        states = af.wait_run(snap)
        assert states["capture"] == "success", states
        newest = list_batches(staging, DAG)[-1]
        customers = batch_rows(newest, "public.customers")
        assert len([r for r in customers if r["op"] == "r"]) == 50  # the one table asked for
        assert batch_rows(newest, "public.orders") == []
        _save_screenshots(shots)

        colors = {}
        for conn_id in ("live_pg", "live_pg_bad"):
            page.goto(f"{af.url}/connections", wait_until="networkidle")  # fresh: no tooltip in the way
            row = page.get_by_role("row").filter(has_text=conn_id).filter(
                has=page.get_by_role("cell", name=conn_id, exact=True)
            )
            button = row.get_by_role("button", name="Test Connection")
            button.click()
            icon = button.locator("svg")
            deadline = time.monotonic() + 60
            while icon.get_attribute("color") not in ("green", "red") and time.monotonic() < deadline:
                page.wait_for_timeout(500)
            colors[conn_id] = icon.get_attribute("color")
            if conn_id == "live_pg_bad":  # the form over the list's Test buttons, the failure in its toast
                row.get_by_role("button", name="Edit Connection").click()
                page.locator("[role=dialog][data-state=open]").wait_for()
                shots["connection_form.png"] = page.screenshot()
        assert colors == {"live_pg": "green", "live_pg_bad": "red"}, colors
        _save_screenshots(shots)
    finally:
        browser.close()
        pw.stop()


def test_sensor_defers_triggerer_resumes_and_idle_runs_do_nothing(live):
    af, db = live
    staging = af.home / "staging"
    before_batches = len(list_batches(staging, DAG))
    before = {r["run_id"] for r in af.runs()}
    af.cli("dags", "trigger", DAG)
    run = af.wait_new_run(before)
    deadline = time.monotonic() + 120
    while af.task_states(run).get("sense") != "deferred":  # waiting in the triggerer, no worker slot
        assert time.monotonic() < deadline, f"the sensor never deferred: {af.task_states(run)}\n{af.logs()}"
        time.sleep(1)
    with db.connect(autocommit=True) as conn:
        conn.execute("INSERT INTO public.customers (id, name) VALUES (901, 'live')")
    states = af.wait_run(run)
    assert states == {"sense": "success", "capture": "success", "commit": "success"}, states
    newest = list_batches(staging, DAG)[-1]
    assert [(r["op"], r["after"]["id"]) for r in batch_rows(newest, "public.customers")] == [("c", 901)]

    before = {r["run_id"] for r in af.runs()}
    count = len(list_batches(staging, DAG))
    af.cli("dags", "trigger", DAG)
    idle = af.wait_new_run(before)
    states = af.wait_run(idle, timeout=240)  # the sensor's 60 s timeout, then skips
    assert states == {"sense": "skipped", "capture": "skipped", "commit": "skipped"}, states
    assert len(list_batches(staging, DAG)) == count > before_batches  # no batch, no commit, no Asset event
    triggerer = (af.home / "triggerer.log").read_text(errors="replace")
    errors = [line for line in triggerer.splitlines() if "[error" in line]
    assert not errors, errors[:5]  # the no-change wait ends with our timeout event, not an error


def _status_here(af: LiveAirflow, db: Any, live: bool) -> dict[str, Any]:
    """``status --json``'s metrics of the DAG's pipeline, computed in the test process (the
    Connection's fields given inline) -- what the CDC tab must show."""
    import yaml

    from airflow_cdc.core.health import status_metrics
    from airflow_cdc.core.pipeline import build_config, build_store

    props = yaml.safe_load((af.home / "dags" / "shop.yaml").read_text())
    props.pop("airflow")
    s = db.server
    props.update({"database.hostname": s.host, "database.port": s.port, "database.user": s.superuser,
                  "database.password": s.password, "database.dbname": db.name})  # fmt: skip
    config = build_config(props)
    stored = build_store(config).load(config.state_name)
    return status_metrics(config, dict(stored.data), live=live)


def test_cdc_tab_shows_lag_retained_wal_and_snapshot_progress(live):
    """The plugin's CDC tab on the DAG page shows silver's lag, the retained WAL and the progress
    of a snapshot left part-way by a committed run, with the values ``status_metrics`` computes;
    its routes refuse a bad credential.  Runs last: the snapshot it leaves pending would make the
    other tests' runs read it."""
    import urllib.error
    import urllib.request

    af, db = live
    pipeline = af.home / "dags" / "shop.yaml"
    original = pipeline.read_text()
    # 100 rows a run in chunks of 50: the run commits the first 100 of the 400 orders
    pipeline.write_text(original + "snapshot.max.rows.per.run: 100\nincremental.snapshot.chunk.size: 50\n")
    try:
        before = {r["run_id"] for r in af.runs()}
        af.cli("dags", "trigger", DAG, "--conf", json.dumps({"snapshot_tables": "public.orders"}))
        states = af.wait_run(af.wait_new_run(before))
        assert states["capture"] == "success" and states["commit"] == "success", states
    finally:
        pipeline.write_text(original)
    saved = _status_here(af, db, live=False)["last"]["capture"]["metrics"]["snapshot"]
    assert saved["SnapshotRunning"] == 1 and saved["RemainingTableCount"] >= 1, saved
    assert 0 < saved["tables"]["public.orders"]["RowsScanned"] < 400, saved

    # the all-admins auth manager gives every request without a credential an admin's token: a bad
    # one shows that the plugin's routes check it (tests/airflow/test_ui_plugin.py: none at all)
    bad = urllib.request.Request(f"{af.url}/cdc/api/dags/{DAG}", headers={"Authorization": "Bearer x"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(bad, timeout=30)
    assert refused.value.code in (401, 403), refused.value.code

    pw, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1350})
        page.goto(f"{af.url}/dags/{DAG}", wait_until="networkidle")
        page.get_by_role("link", name="CDC", exact=True).click()
        frame = page.frame_locator("iframe")
        section = frame.locator(f'section.pipeline[data-dag_id="{DAG}"]')
        section.wait_for(timeout=60_000)

        def shown(metric: str, table: str | None = None) -> str:
            cells = section.locator(f'td[data-metric="{metric}"]')
            if table is not None:
                cells = section.locator("tr").filter(has_text=f"Rows scanned: {table}").locator("td")
            assert cells.first.inner_text() not in ("", "—"), f"{metric} not shown"
            return cells.first.get_attribute("data-value")

        lag_ms, retained = int(shown("silver.LagMs")), int(shown("source.RetainedLogBytes"))
        remaining, tables = int(shown("snapshot.RemainingTableCount")), int(shown("snapshot.TotalTableCount"))
        rows = {t: int(shown("snapshot.RowsScanned", t)) for t in saved["tables"]}
        wal_status, state = shown("source.WalStatus"), shown("snapshot.State")
        shots = {"cdc_tab.png": page.screenshot()}
        fresh = _status_here(af, db, live=True)
        # saved values: exactly the same; live ones: measured a few seconds apart
        assert (remaining, tables) == (saved["RemainingTableCount"], saved["TotalTableCount"])
        assert rows == {t: v["RowsScanned"] for t, v in saved["tables"].items()}, rows
        assert state == "running" and wal_status == fresh["now"]["source"]["WalStatus"] == "reserved"
        assert 0 <= fresh["now"]["silver"]["LagMs"] - lag_ms < 60_000, (lag_ms, fresh["now"]["silver"])
        assert retained > 0 and abs(fresh["now"]["source"]["RetainedLogBytes"] - retained) < 64 << 20
        served = page.request.get(f"{af.url}/cdc/api/dags/{DAG}?live=0").json()  # the session's cookie
        [doc] = served["pipelines"]
        assert doc["metrics"]["last"]["capture"]["metrics"]["snapshot"] == saved
        _save_screenshots(shots)

        page.goto(f"{af.url}/plugin/cdc", wait_until="networkidle")  # Browse > CDC pipelines: every DAG's
        frame.locator(f'section.pipeline[data-dag_id="{DAG}"]').wait_for(timeout=60_000)
    finally:
        browser.close()
        pw.stop()
