"""A throwaway S3 server for the tests: s3proxy (``org.gaul:s3proxy``) on loopback.

s3proxy is a real HTTP server speaking the S3 API with AWS signature checks, over a filesystem
backend that survives a restart (the failure tests stop it mid-run and start it again on the
same port and data).  ``make setup`` fetches its ``jar-with-dependencies`` with Maven into
``.local/s3proxy/`` (:data:`JAR_ENV` names another); Java is already there for Spark.  Tests
that need it skip, saying so, when the jar or Java is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Self

from airflow_cdc.core.storage.settings import StorageSettings
from airflow_cdc.testing.servers import ServerStartError, free_port, log_tail

VERSION = "4.1.0"
JAR_ENV = "AIRFLOW_CDC_S3PROXY_JAR"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_JAR = REPO / ".local" / "s3proxy" / f"s3proxy-{VERSION}-jar-with-dependencies.jar"
REGION = "us-east-1"


def s3proxy_jar() -> Path | None:
    """The s3proxy jar, or None when it (or Java) is missing."""
    jar = Path(os.environ.get(JAR_ENV) or DEFAULT_JAR)
    return jar if jar.is_file() and shutil.which("java") else None


class S3ProxyServer:
    """s3proxy on ``127.0.0.1:<free port>`` with a data directory of its own.

    ``start`` waits until it answers; ``stop`` kills it (SIGKILL: like a crash) and keeps the
    data, ``start`` again brings the same objects back on the same port; ``close`` removes all.

    :param bind: the address it listens on and its clients use (default loopback); it must be
        reachable from this process, which waits for the port and creates the buckets.
    :param command_prefix: argv put before ``java``, e.g. ``["ip", "netns", "exec", "store"]``.
    """

    def __init__(
        self, *, start_timeout: float = 60.0, bind: str = "127.0.0.1", command_prefix: Sequence[str] = ()
    ) -> None:
        jar = s3proxy_jar()
        if jar is None:
            raise ServerStartError(f"s3proxy jar or java missing ({DEFAULT_JAR}): run `make setup`")
        self.jar = jar
        self.base_dir = Path(tempfile.mkdtemp(prefix="cdc-s3proxy-"))
        (self.base_dir / "data").mkdir()
        self.port = free_port()
        self.access_key = "cdc-test-key"
        self.secret_key = f"cdc-test-secret-{uuid.uuid4().hex[:8]}"
        self.start_timeout = start_timeout
        self.bind = bind
        self.command_prefix = list(command_prefix)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.bind}:{self.port}"

    @property
    def settings(self) -> StorageSettings:
        return StorageSettings(
            endpoint=self.endpoint,
            region=REGION,
            path_style=True,
            access_key=self.access_key,
            secret_key=self.secret_key,
        )

    def env(self) -> dict[str, str]:
        """``AWS_*`` variables that point the libraries (and Spark's S3A) at this server."""
        return {**self.settings.env(), "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": REGION}

    def _write_conf(self) -> Path:
        conf = self.base_dir / "s3proxy.conf"
        conf.write_text(
            f"s3proxy.endpoint={self.endpoint}\n"
            "s3proxy.authorization=aws-v2-or-v4\n"
            f"s3proxy.identity={self.access_key}\n"
            f"s3proxy.credential={self.secret_key}\n"
            "jclouds.provider=filesystem-nio2\n"
            f"jclouds.filesystem.basedir={self.base_dir / 'data'}\n"
        )
        conf.chmod(0o600)
        return conf

    def start(self) -> Self:
        """Start (or restart after :meth:`stop`) and wait until the port answers.

        :raises ServerStartError: with the log's tail when it does not come up in time.
        """
        if self._proc is not None and self._proc.poll() is None:
            return self
        log = open(self.base_dir / "s3proxy.log", "ab")  # noqa: SIM115 - the child keeps it
        cmd = [*self.command_prefix, "java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-jar", str(self.jar)]
        self._proc = subprocess.Popen(
            [*cmd, "--properties", str(self._write_conf())],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                with socket.create_connection((self.bind, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        tail = log_tail(self.base_dir / "s3proxy.log")
        raise ServerStartError(f"s3proxy did not start on {self.endpoint}:\n{tail}")

    def stop(self) -> None:
        """Kill the server (its data stays for the next :meth:`start`)."""
        if self._proc is not None:
            if self._proc.poll() is None:
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=30)
            self._proc = None

    def close(self) -> None:
        """Stop and remove the data."""
        self.stop()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def make_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique one by default) and return its name."""
        import pyarrow.fs as pafs

        name = name or f"cdc-{uuid.uuid4().hex[:12]}"
        s = self.settings
        fs = pafs.S3FileSystem(
            access_key=s.access_key,
            secret_key=s.secret_key,
            region=REGION,
            endpoint_override=f"{self.bind}:{self.port}",
            scheme="http",
            allow_bucket_creation=True,
        )
        fs.create_dir(name)
        return name

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"S3ProxyServer({self.endpoint}, dir={self.base_dir})"


def configure_spark(spark: object, server: S3ProxyServer) -> None:
    """Point a running session's S3A (``s3a://``) at ``server`` (tests only: the keys go into
    the session's Hadoop configuration; deployments give them through the environment)."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[attr-defined]
    for key, value in s3a_conf(server).items():
        conf.set(key, value)


def s3a_conf(server: S3ProxyServer) -> dict[str, str]:
    """Hadoop's S3A keys that reach ``server`` (prefix them with ``spark.hadoop.`` for a Spark
    launch conf, e.g. a Spark Connect server's)."""
    return {
        "fs.s3a.endpoint": server.endpoint,
        "fs.s3a.endpoint.region": REGION,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.access.key": server.access_key,
        "fs.s3a.secret.key": server.secret_key,
        "fs.s3a.attempts.maximum": "3",
        "fs.s3a.retry.limit": "3",
    }
