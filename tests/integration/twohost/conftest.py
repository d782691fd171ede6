"""The ``hosts`` fixture: a capture host, a Spark host and an object store in network namespaces."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_cdc.testing import netns
from airflow_cdc.testing.s3proxy import s3proxy_jar
from airflow_cdc.testing.spark_connect import spark_home
from tests.integration.twohost.hosts import TwoHosts, two_hosts


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoHosts]:
    """The three namespaces with their servers (Spark Connect still starting); all removed after
    the module, also when a test failed."""
    if os.environ.get("AIRFLOW_CDC_TWOHOST") == "0":
        pytest.skip("two-host test: off (AIRFLOW_CDC_TWOHOST=0)")
    reason = netns.unavailable()
    if reason:
        pytest.skip(f"two-host test: {reason}")
    if s3proxy_jar() is None:
        pytest.skip("two-host test: the s3proxy jar or java is missing (make setup)")
    if spark_home() is None or shutil.which("java") is None:
        pytest.skip("two-host test: pyspark or java is missing (make setup)")
    netns.sweep_stale()  # namespaces and servers of a run killed before its finalizers
    with _sigterm_unwinds(), two_hosts(tmp_path_factory.mktemp("twohost")) as made:
        yield made


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Turn a SIGTERM (``timeout``, a CI runner giving up) into KeyboardInterrupt while the hosts
    exist, so the finalizers still remove the namespaces and stop the servers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
