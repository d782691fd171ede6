"""Two "hosts" on this machine that share nothing but an S3 bucket (see test_two_hosts.py).

Three network namespaces made by :class:`airflow_cdc.testing.netns.Lab`:

* ``cap`` -- the capture host (Airflow's side): PostgreSQL on its own loopback, the
  ``airflow-cdc`` CLI processes, the state store and the pipeline file in a private directory;
* ``spark`` -- the Spark host: a Spark Connect server on its end of the cap<->spark link (what
  ``spark.remote`` names), with its own scratch, temp and warehouse directory;
* ``store`` -- the object store: s3proxy on a ``/32`` of its loopback, routed from both hosts
  (and from the root namespace, where the test runs) over a veth link each.

``store`` routes nothing (a new namespace's ``ip_forward`` is 0) and no namespace has a default
route, so the hosts reach only the store's address and each other's link address.  Every process
of a host runs with the other host's directories (and the database's and the store's data) behind
an empty read-only tmpfs: a host cannot read or write anything of the other but through S3.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from airflow_cdc.testing.netns import Lab, Namespace
from airflow_cdc.testing.s3proxy import REGION, S3ProxyServer
from airflow_cdc.testing.servers import PostgresServer
from airflow_cdc.testing.spark_connect import SparkConnectServer

CLI = [sys.executable, "-m", "airflow_cdc.cli"]
#: environment a host's processes must not inherit from the test (they get their own)
_FOREIGN_ENV = ("AWS_", "SPARK_", "PYSPARK_", "AIRFLOW_CDC_FAILPOINTS", "JAVA_TOOL_OPTIONS")


@dataclass
class TwoHosts:
    lab: Lab
    capture: Namespace
    spark: Namespace
    store: Namespace
    capture_dir: Path
    spark_dir: Path
    s3: S3ProxyServer
    pg: PostgresServer
    connect: SparkConnectServer
    spark_address: str  # the Spark host's end of the cap<->spark link
    capture_link: str  # the capture host's end of it
    spark_store_link: str  # the Spark host's end of its link to the store
    bucket: str
    capture_hide: list[Path]
    spark_hide: list[Path]
    connect_started: Future[Any] = field(repr=False, default_factory=Future)

    @property
    def pipeline_file(self) -> Path:
        return self.capture_dir / "pipeline.json"

    def spark_ready(self, timeout: float = 300) -> None:
        """Wait for the first start of the Spark Connect server (begun in the background)."""
        self.connect_started.result(timeout)

    def capture_env(self, failpoints: str = "") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV)}
        env.update(self.s3.env())  # what an Airflow worker's environment gives: endpoint + keys
        env.update(
            TMPDIR=str(self.capture_dir / "tmp"), HOME=str(self.capture_dir / "home"), PYTHONFAULTHANDLER="1"
        )
        if failpoints:
            env["AIRFLOW_CDC_FAILPOINTS"] = failpoints
        return env

    def cli(self, *args: str, failpoints: str = "", log: str | None = None) -> subprocess.Popen[bytes]:
        """``airflow-cdc ARGS --config pipeline.json`` on the capture host: stdout and stderr piped,
        or (``log``) written to ``<capture dir>/logs/<log>.out`` / ``.err`` (nothing blocks on a
        full pipe while the test does something else)."""
        out: Any = subprocess.PIPE
        err: Any = subprocess.PIPE
        if log is not None:
            (self.capture_dir / "logs").mkdir(mode=0o700, exist_ok=True)
            out = open(self.capture_dir / "logs" / f"{log}.out", "wb")  # noqa: SIM115 - closed below
            err = open(self.capture_dir / "logs" / f"{log}.err", "wb")  # noqa: SIM115
        try:
            return self.capture.popen(
                [*CLI, *args, "--config", str(self.pipeline_file)],
                hide=self.capture_hide,
                env=self.capture_env(failpoints),
                cwd=self.capture_dir,
                stdout=out,
                stderr=err,
            )
        finally:
            if log is not None:
                out.close()
                err.close()

    def cli_log(self, log: str) -> tuple[str, str]:
        """The stdout and stderr of the ``cli(..., log=log)`` run."""
        base = self.capture_dir / "logs" / log
        return base.with_suffix(".out").read_text(), base.with_suffix(".err").read_text()

    def on_capture(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return self.capture.run(argv, hide=self.capture_hide, env=self.capture_env(), timeout=60)

    def on_spark(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return self.spark.run(argv, hide=self.spark_hide, timeout=60)


def _private_dir(path: Path) -> Path:
    for sub in ("", "tmp", "home"):
        (path / sub).mkdir(mode=0o700, exist_ok=True)
    return path


def _s3a_conf(s3: S3ProxyServer) -> dict[str, str]:
    """The Spark host's S3A settings (its cluster config; the keys come by environment)."""
    return {
        "spark.hadoop.fs.s3a.endpoint": s3.endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": REGION,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.attempts.maximum": "3",
        "spark.hadoop.fs.s3a.retry.limit": "3",
    }


@contextlib.contextmanager
def two_hosts(base: Path) -> Iterator[TwoHosts]:
    """Build the namespaces, links and servers; remove all of it on exit, failed or not.

    The Spark Connect server starts in the background (:meth:`TwoHosts.spark_ready` waits).
    """
    with contextlib.ExitStack() as stack:
        lab = stack.enter_context(Lab())
        capture, spark, store = (lab.namespace(r) for r in ("cap", "spark", "store"))
        s3_address = lab.address(store)
        ends = {}
        for name, host in (("root", None), ("cap", capture), ("spark", spark)):
            ends[name], store_end = lab.link(host, store)
            lab.route(host, s3_address, store_end)
        capture_link, spark_address = lab.link(capture, spark)
        capture_dir = _private_dir(base / "capture-host")
        spark_dir = _private_dir(base / "spark-host")
        s3 = S3ProxyServer(bind=s3_address, command_prefix=store.prefix(hide=[capture_dir, spark_dir]))
        stack.callback(s3.close)
        s3.start()
        bucket = s3.make_bucket()
        pg = PostgresServer(command_prefix=capture.prefix(hide=[spark_dir, s3.base_dir]))
        stack.callback(pg.stop)
        pg.start()
        assert pg.base_dir is not None
        spark_hide = [capture_dir, pg.base_dir, s3.base_dir]
        connect = SparkConnectServer(
            host=spark_address,
            conf=_s3a_conf(s3),
            # credentials by environment (S3A's provider chain); no perf data in the shared /tmp
            env={
                "AWS_ACCESS_KEY_ID": s3.access_key,
                "AWS_SECRET_ACCESS_KEY": s3.secret_key,
                "AWS_REGION": REGION,
                "HOME": str(spark_dir / "home"),
                "JAVA_TOOL_OPTIONS": "-XX:-UsePerfData",
            },
            command_prefix=spark.prefix(hide=spark_hide),
            work_dir=spark_dir / "connect",
        )
        stack.callback(connect.close)
        pool = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="connect-start"))
        stack.callback(connect.kill)  # first (LIFO): ends a start still waiting in the pool
        hosts = TwoHosts(
            lab=lab,
            capture=capture,
            spark=spark,
            store=store,
            capture_dir=capture_dir,
            spark_dir=spark_dir,
            s3=s3,
            pg=pg,
            connect=connect,
            spark_address=spark_address,
            capture_link=capture_link,
            spark_store_link=ends["spark"],
            bucket=bucket,
            capture_hide=[spark_dir, s3.base_dir],
            spark_hide=spark_hide,
            connect_started=pool.submit(connect.start),
        )
        yield hosts


def tcp_open(host: str, port: int, timeout: float = 2.0) -> bool | str:
    """True when ``host:port`` accepts a connection, else the error (refused, unreachable ...)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError as e:
        return f"{type(e).__name__}: {e}"


@contextlib.contextmanager
def loopback_listener(ns: Namespace) -> Iterator[int]:
    """A TCP listener on ``ns``'s 127.0.0.1 (a thread of this process inside ``ns``); yields its port."""
    ready: list[int] = []
    stop = threading.Event()

    def serve() -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            sock.settimeout(0.2)
            ready.append(sock.getsockname()[1])
            while not stop.is_set():
                try:
                    conn, _ = sock.accept()
                    conn.close()
                except TimeoutError:
                    continue

    t = ns.thread(serve)
    t.start()
    deadline = time.monotonic() + 10
    while not ready and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield ready[0]
    finally:
        stop.set()
        t.join(5)


class JavaWatch:
    """Records every ``java`` process that runs in ``ns`` while the context is open (psutil finds
    the JVMs of the machine, ``ip netns identify`` says whose they are)."""

    def __init__(self, ns: Namespace, interval: float = 0.3) -> None:
        self.ns, self.interval = ns, interval
        self.found: list[str] = []
        self._seen: dict[tuple[int, float], bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="java-watch", daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.check()
            self._stop.wait(self.interval)

    def check(self) -> None:
        for proc in psutil.process_iter(["name", "cmdline", "create_time"]):
            info = proc.info
            cmdline = info.get("cmdline") or []
            if info.get("name") != "java" and not (cmdline and cmdline[0].endswith("/java")):
                continue
            key = (proc.pid, info.get("create_time") or 0.0)
            if key not in self._seen:
                self._seen[key] = self.ns.owns(proc.pid)
                if self._seen[key]:
                    self.found.append(f"pid {proc.pid}: {' '.join(cmdline)[:300]}")

    def __enter__(self) -> JavaWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.check()


def connected_to(pid: int, address: str, port: int) -> bool:
    """Whether process ``pid`` or a descendant has an established TCP connection to ``address:port``.

    Reads ``/proc/<pid>/net/tcp``, the table of the process's own network namespace (psutil reads
    the caller's ``/proc/net/tcp``: it sees no sockets of another namespace)."""
    v4 = socket.inet_aton(address)[::-1].hex().upper()  # the kernel's table prints host byte order
    want = {f"{v4}:{port:04X}", f"0000000000000000FFFF0000{v4}:{port:04X}"}  # gRPC: v4-mapped IPv6
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for proc in procs:
        try:
            inodes = {
                os.readlink(f"/proc/{proc.pid}/fd/{fd}")[8:-1]
                for fd in os.listdir(f"/proc/{proc.pid}/fd")
                if os.readlink(f"/proc/{proc.pid}/fd/{fd}").startswith("socket:[")
            }
            lines = [
                line
                for table in ("tcp", "tcp6")
                for line in Path(f"/proc/{proc.pid}/net/{table}").read_text().splitlines()[1:]
            ]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[2] in want and fields[3] == "01" and fields[9] in inodes:  # 01: ESTABLISHED
                return True
    return False
