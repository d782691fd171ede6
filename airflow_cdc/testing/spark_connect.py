"""A throwaway Spark Connect server for the tests, the benchmarks and the two-host test.

Spark Connect ships inside pip's pyspark (``jars/spark-connect_*.jar``); the server is the class
``org.apache.spark.sql.connect.service.SparkConnectServer`` started by ``spark-submit`` with the
``spark-internal`` primary resource, as Spark's own ``sbin/start-connect-server.sh`` does.  It
gets the Delta and S3A jars ``make setup`` fetched, the Delta session extension and catalog, and
listens on ``host:port`` (``spark.connect.grpc.binding.address`` / ``.port``).  Clients connect with
``SparkSession.builder.remote(server.url)``.

``kill`` is a crash (SIGKILL of the driver); ``start`` again brings a new driver up on the same
address.  ``command_prefix`` runs it elsewhere, e.g. ``["ip", "netns", "exec", "sparkhost"]``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from airflow_cdc.testing.servers import ServerStartError, free_port, log_tail
from spark_jobs.cdc_apply.layout import DELTA_CONF, JARS_ENV, S3_LOG_STORE_CONF

REPO = Path(__file__).resolve().parents[2]
LOG4J = REPO / "spark_jobs" / "log4j2-warn.properties"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: what the server logs once it listens (``SparkConnectServer.main``)
READY_LINE = "Spark Connect server started"


def spark_home() -> Path | None:
    """pip's pyspark folder (it holds ``bin/spark-submit`` and the jars), or None."""
    try:
        import pyspark
    except ImportError:
        return None
    home = Path(pyspark.__file__).parent
    return home if (home / "bin" / "spark-submit").exists() else None


def delta_jar_list() -> list[str]:
    folder = os.environ.get(JARS_ENV) or str(REPO / ".jars")
    return sorted(glob.glob(os.path.join(folder, "*.jar")))


class SparkConnectServer:
    """A Spark Connect server on ``host:port`` (default loopback, a free port), ``local[N]`` master.

    :param conf: more Spark conf (e.g. the S3A endpoint keys); it overrides the defaults.
    :param env: more environment (e.g. AWS credentials for S3A's provider chain).
    :param command_prefix: argv put before ``spark-submit`` (a network namespace, a user).
    :param work_dir: its temporary and scratch directory (default: a new private one).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        master: str = "local[2]",
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        command_prefix: Sequence[str] = (),
        work_dir: str | os.PathLike[str] | None = None,
        driver_memory: str = "2g",
        start_timeout: float = 180.0,
    ) -> None:
        home = spark_home()
        if home is None or shutil.which("java") is None:
            raise ServerStartError("pyspark or java missing: run `make setup`")
        self.home = home
        self.host = host
        self.port = port or free_port()
        self.master = master
        self.conf = dict(conf or {})
        self.env = dict(env or {})
        self.command_prefix = list(command_prefix)
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="cdc-connect-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.driver_memory = driver_memory
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"sc://{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "connect-server.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def command(self) -> list[str]:
        tmp = self.work_dir / "tmp"
        conf = {
            **DELTA_CONF,
            **S3_LOG_STORE_CONF,  # the jar folder has our put-if-absent S3 log store
            "spark.connect.grpc.binding.address": self.host,
            "spark.connect.grpc.binding.port": str(self.port),
            # the driver's own endpoints on the same address (not the host's first interface)
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.local.dir": str(self.work_dir / "local"),
            "spark.sql.warehouse.dir": str(self.work_dir / "warehouse"),
            # WARN and above: at INFO a server logs megabytes per apply
            "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={tmp} -Dderby.system.home={tmp} "
            f"-Dlog4j2.configurationFile=file:{self._log_config()}",
            "spark.sql.shuffle.partitions": "4",
            "spark.databricks.delta.snapshotPartitions": "2",
            **self.conf,
        }
        cmd = [
            *self.command_prefix,
            str(self.home / "bin" / "spark-submit"),
            "--master",
            self.master,
            "--driver-memory",
            self.driver_memory,
            "--class",
            SERVER_CLASS,
            "--name",
            "airflow-cdc test Spark Connect server",
        ]
        jars = delta_jar_list()
        if jars:
            cmd += ["--jars", ",".join(jars)]
        for key, value in sorted(conf.items()):
            cmd += ["--conf", f"{key}={value}"]
        return [*cmd, "spark-internal"]

    def _log_config(self) -> Path:
        """Spark's WARN-only log configuration, plus the server's own start line (at INFO: it
        says when a server in another network namespace listens)."""
        path = self.work_dir / "log4j2.properties"
        extra = "logger.connect.name = org.apache.spark.sql.connect.service\nlogger.connect.level = info\n"
        path.write_text(LOG4J.read_text() + extra)
        return path

    def start(self) -> Self:
        """Start the server and wait until it accepts connections."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        (self.work_dir / "tmp").mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_LOCAL_DIRS": str(self.work_dir / "local"),
            "TMPDIR": str(self.work_dir / "tmp"),
            **self.env,
        }
        env.pop("SPARK_CONNECT_MODE_ENABLED", None)
        env.pop("SPARK_REMOTE", None)
        log = open(self.log_file, "ab")  # noqa: SIM115 - kept open for the process's life
        self._proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        self.starts += 1
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServerStartError(
                    f"Spark Connect server exited with {self._proc.returncode}:\n{log_tail(self.log_file)}"
                )
            if self._ready():
                return self
            time.sleep(0.5)
        self.kill()
        raise ServerStartError(
            f"Spark Connect server not up after {self.start_timeout}s:\n{log_tail(self.log_file)}"
        )

    def _ready(self) -> bool:
        if self.command_prefix:  # maybe another network namespace: the log says, not a local socket
            return self._log_count(READY_LINE) >= self.starts
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _log_count(self, line: str) -> int:
        try:
            return self.log_file.read_text(errors="replace").count(line)
        except OSError:
            return 0

    def kill(self) -> None:
        """SIGKILL the server's whole process group (a crash of the Spark driver)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait(timeout=30)
        self._proc = None

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
