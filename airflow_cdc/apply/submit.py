"""Build the ``spark-submit`` call that applies one staged batch, and run it locally.

One spec serves both the Airflow ``SparkSubmitOperator`` (application, application_args, conf,
packages/jars, py_files) and ``airflow-cdc apply`` (a local ``spark-submit`` subprocess), so the
two can never drift apart.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from airflow_cdc.core.config import ConnectorConfig
from airflow_cdc.core.errors import (
    ApplyFailed,
    ApplyInterrupted,
    BatchError,
    CdcError,
    ConfigError,
    LeaseLost,
    SchemaError,
    StorageUnavailable,
)
from airflow_cdc.core.lease import Lease
from airflow_cdc.core.storage import StorageSettings, is_remote, open_location
from airflow_cdc.core.storage.settings import AzureSettings, GcsSettings
from spark_jobs.cdc_apply.layout import (
    CALL_SITES_CONF,
    DELTA_CONF,
    DELTA_PACKAGE,
    EXIT_CATALOG,
    EXIT_DAMAGED,
    EXIT_FENCED,
    EXIT_MEMORY,
    EXIT_REMOTE,
    EXIT_SCHEMA,
    EXIT_STORAGE,
    JARS_ENV,
    LAYERS,
    S3_LOG_STORE_CONF,
    S3A_PACKAGES,
    default_driver_memory,
    table_path,
)

log = logging.getLogger(__name__)
#: the exit code of a Spark JVM that died of an OutOfMemoryError (``SparkExitCode.OOM``)
SPARK_EXIT_OOM = 52


@dataclass(frozen=True)
class ApplyOptions:
    """How a batch lands in Delta.

    :param delete_mode: ``delete`` removes silver rows; ``soft`` keeps them with ``__deleted = true``.
    :param bronze: append every event to the bronze change log.
    :param bronze_copy: add the staged files to bronze as they are where Delta allows
        (``delta.bronze.file.copy``).
    :param deletion_vectors: create new silver and tombstone tables with deletion vectors
        (``delta.deletion.vectors.enabled``, on by default); existing tables keep theirs.
    :param rewrite_ratio: rewrite a silver table instead of MERGE into it when the batch has at
        least this many events per stored row (``delta.rewrite.ratio``); 0 always MERGEs.
    :param optimize_interval: compact silver and tombstone tables (Delta ``OPTIMIZE``) after
        every this many batches that wrote them (``delta.optimize.interval.batches``); 0 never.
    :param history: regexes of tables that keep SCD type 2 history (``delta.history.enabled``:
        ``("true",)`` for all, ``()`` or ``("false",)`` for none).
    :param history_except: regexes of ``<table>.<column>`` names whose changes update the current
        version in place (``delta.history.except.columns``).
    :param catalog: register bronze, silver and history in this catalog namespace
        (``delta.catalog``: ``catalog.schema`` or ``schema``); None: locations only.
    :param catalog_format: the registered names (``delta.catalog.table.format``).
    """

    #: the pipeline properties these options come from, in field order
    PROPERTIES: ClassVar[tuple[str, ...]] = (
        "delta.delete.mode",
        "delta.bronze.enabled",
        "delta.rewrite.ratio",
        "delta.optimize.interval.batches",
        "delta.history.enabled",
        "delta.history.except.columns",
        "delta.bronze.file.copy",
        "delta.deletion.vectors.enabled",
        "delta.catalog",
        "delta.catalog.table.format",
    )

    delete_mode: str = "delete"
    bronze: bool = True
    rewrite_ratio: float = 0.5
    optimize_interval: int = 100
    history: tuple[str, ...] = ()
    history_except: tuple[str, ...] = ()
    bronze_copy: bool = True
    deletion_vectors: bool = True
    catalog: str | None = None
    catalog_format: str = "{layer}_{table}"

    @classmethod
    def from_config(cls, config: ConnectorConfig) -> ApplyOptions:
        return cls(*(config[name] for name in cls.PROPERTIES))

    def __post_init__(self) -> None:
        if self.delete_mode not in ("delete", "soft"):
            raise ConfigError(f"delete mode must be 'delete' or 'soft', not {self.delete_mode!r}")
        if not self.rewrite_ratio >= 0:
            raise ConfigError(f"delta.rewrite.ratio must be >= 0, not {self.rewrite_ratio!r}")
        if not self.optimize_interval >= 0:
            raise ConfigError(f"delta.optimize.interval.batches must be >= 0, not {self.optimize_interval!r}")
        if self.catalog:
            try:
                self.catalog_format.format(layer="silver", table="s_t", schema="s", name="t", connector="c")
            except (KeyError, IndexError, ValueError) as e:
                raise ConfigError(
                    f"property 'delta.catalog.table.format': {self.catalog_format!r} is not a name template "
                    f"({e}); use the fields {{layer}}, {{table}}, {{schema}}, {{name}}, {{connector}}"
                ) from e
        for prop, patterns in (
            ("delta.history.enabled", self.history_tables()),
            ("delta.history.except.columns", tuple(self.history_except)),
        ):
            for pattern in patterns:
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise ConfigError(
                        f"property {prop!r}: {pattern!r} is not a regular expression: {e}"
                    ) from e

    def history_tables(self) -> tuple[str, ...]:
        """Regexes of the tables with history (``true``: every table; ``false``: none)."""
        words = tuple(p.strip() for p in self.history if p.strip())
        if len(words) == 1 and words[0].lower() in ("true", "false"):
            return (".*",) if words[0].lower() == "true" else ()
        return words

    def args(self) -> list[str]:
        out = ["--delete-mode", self.delete_mode, "--rewrite-ratio", repr(float(self.rewrite_ratio))]
        out += ["--optimize-interval", str(int(self.optimize_interval))]
        if not self.bronze:
            out.append("--no-bronze")
        if not self.bronze_copy:
            out.append("--no-bronze-copy")
        out.append("--deletion-vectors" if self.deletion_vectors else "--no-deletion-vectors")
        for pattern in self.history_tables():
            out += ["--history", pattern]
        for pattern in self.history_except:
            out += ["--history-except", pattern]
        if self.catalog:
            out += ["--catalog", self.catalog, "--catalog-format", self.catalog_format]
        return out


@dataclass(frozen=True)
class SparkApplyJob:
    """Everything ``spark-submit`` needs to apply a batch, or consecutive batches (maps 1:1 onto
    SparkSubmitOperator)."""

    application: str
    application_args: list[str]
    conf: dict[str, str]
    name: str
    packages: str | None = None
    jars: str | None = None
    py_files: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    #: a Spark Connect server: the job runs here as its client (``command`` is then no spark-submit)
    remote: str | None = None

    def batches(self) -> str:
        """The batch ids the job applies, for messages: ``<id>``, or ``<first> .. <last> (N)``."""
        args = self.application_args
        ids = [Path(args[i + 1]).name for i, a in enumerate(args[:-1]) if a == "--batch"]
        return ids[0] if len(ids) == 1 else f"{ids[0]} .. {ids[-1]} ({len(ids)} batches)"

    def command(self, master: str = "local[2]", spark_submit: str | None = None) -> list[str]:
        """The full ``spark-submit`` command line; with :attr:`remote`, the Connect client's
        (this Python, no JVM; the server URL goes by environment, ``SPARK_REMOTE``, as it may hold
        a token, and runtime conf as ``--conf``)."""
        if self.remote:
            conf = [arg for k, v in sorted(remote_conf(self.conf).items()) for arg in ("--conf", f"{k}={v}")]
            return [sys.executable, self.application, *self.application_args, *conf]
        cmd = [spark_submit or spark_submit_binary(), "--master", master, "--name", self.name]
        if self.packages:
            cmd += ["--packages", self.packages]
        if self.jars:
            cmd += ["--jars", self.jars]
        if self.py_files:
            cmd += ["--py-files", self.py_files]
        for k, v in sorted(self.conf.items()):
            cmd += ["--conf", f"{k}={v}"]
        return [*cmd, self.application, *self.application_args]


#: Spark settings a running Connect server takes per session (the rest are launch settings of the
#: server: memory, jars, extensions, catalogs, Hadoop's)
_STATIC_SQL = (
    "spark.sql.extensions",
    "spark.sql.catalog.",
    "spark.sql.warehouse.dir",
    "spark.sql.catalogImplementation",
)


def remote_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """The runtime settings of ``conf`` (``spark.sql.*``, ``spark.databricks.delta.*``) that a
    Spark Connect client sets on its session."""
    return {
        k: v
        for k, v in conf.items()
        if k.startswith(("spark.sql.", "spark.databricks.delta.")) and not k.startswith(_STATIC_SQL)
    }


def mask_remote(url: str) -> str:
    """A Spark Connect URL with its ``token`` parameter masked (``sc://h:15002/;token=****``)."""
    return re.sub(r"(?i)(;token=)[^;]*", r"\1****", url)


def spark_jobs_dir() -> Path:
    """The ``spark_jobs`` directory (installed package or source checkout)."""
    spec = importlib.util.find_spec("spark_jobs")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the spark_jobs package is not installed: reinstall airflow-cdc")
    return Path(next(iter(spec.submodule_search_locations)))


def spark_submit_binary() -> str:
    """``spark-submit`` from ``$SPARK_HOME``, ``PATH``, or the installed ``pyspark`` package."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "bin" / "spark-submit").exists():
        return str(Path(home) / "bin" / "spark-submit")
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / "bin" / "spark-submit"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("spark-submit")
    if found:
        return found
    raise ConfigError("spark-submit not found: install pyspark or set SPARK_HOME")


def delta_jars() -> tuple[str | None, str | None]:
    """``(packages, jars)``: Maven coordinates, or the local jar directory from :data:`JARS_ENV`."""
    folder = os.environ.get(JARS_ENV)
    if folder:
        jars = sorted(str(p) for p in Path(folder).glob("*.jar"))
        if not jars:
            raise ConfigError(f"{JARS_ENV}={folder} holds no .jar files (run `make setup`)")
        return None, ",".join(jars)
    return DELTA_PACKAGE, None


def job_library_zip(cache: Path | None = None) -> str:
    """Zip ``spark_jobs/cdc_apply`` for ``--py-files`` (cached by content hash)."""
    src = spark_jobs_dir() / "cdc_apply"
    files = sorted(p for p in src.rglob("*.py"))
    digest = hashlib.sha256()
    for p in files:
        digest.update(p.relative_to(src.parent).as_posix().encode())
        digest.update(p.read_bytes())
    cache = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "airflow-cdc"
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"cdc_apply-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for p in files:
                z.write(p, p.relative_to(src.parent).as_posix())
        os.replace(tmp, target)
    return str(target)


def build_apply_job(
    batch: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    target: str,
    *,
    options: ApplyOptions | None = None,
    conf: Mapping[str, str] | None = None,
    name: str | None = None,
    fence: int | None = None,
    master: str | None = None,
    storage: StorageSettings | None = None,
    remote: str | None = None,
) -> SparkApplyJob:
    """Describe the Spark job that applies ``batch`` to the Delta root ``target``.

    Nothing runs here.  Re-running the described job on an already applied batch changes nothing.

    :param batch: a published batch directory (``<staging>/<connector>/batches/<id>``), or
        consecutive batches of one connector (partition), oldest first: the job applies each
        table's stretch of them in one pass (``spark_jobs/cdc_apply/backlog.py``).
    :param target: the Delta root; tables land under ``<target>/<layer>/<connector>/<table>``.
    :param conf: extra Spark conf; it overrides the defaults (:func:`launch_defaults`; the job
        sizes its runtime settings to its cores and heap unless given here).
    :param fence: the submitter's lease token: recorded in the Delta commit info, and the job
        stops before writing a table a newer token already wrote.
    :param master: the Spark master the job will run on, if known (local masters get a driver
        heap sized to this machine).
    :param storage: endpoint and credentials of the object store the batches or ``target`` are
        on (default: S3A keys in ``conf``, then the environment).  Credentials go into the job's
        environment, never into its command line.
    :param remote: a Spark Connect server (``sc://host:port``, ``spark.remote``): the job runs on
        this host as its client (no JVM, jars or ``spark-submit`` here); the server reads the
        batches and writes Delta with its own store settings.
    """
    given = [batch] if isinstance(batch, (str, os.PathLike)) else list(batch)
    paths = [open_location(b, storage) for b in given]
    if not paths:
        raise BatchError("no batch to apply")
    for path in paths:
        if not (path / "manifest.json").exists():
            raise BatchError(f"{path} is not a published batch (no manifest.json)")
    packages, jars = (None, None) if remote else delta_jars()
    merged = {**launch_defaults(master), **(conf or {})}
    env = {"SPARK_REMOTE": remote} if remote else _python_env()
    schemes = {str(p.url).split("://", 1)[0] for p in paths if is_remote(p)}
    if is_remote(target):
        schemes.add(str(target).split("://", 1)[0])
    if schemes & {"s3", "s3a"}:
        s3 = s3_launch(storage, merged)
        # the put-if-absent log store (its jar is in the jar folder; Delta refuses it beside logStore.class)
        store = {} if remote or not jars or "spark.delta.logStore.class" in merged else S3_LOG_STORE_CONF
        merged = {**s3.hadoop_conf(), **store, **merged}
        env |= s3.env()  # credentials reach the job (S3A's provider chain, pyarrow) by environment
        if packages is not None and not remote:
            packages = ",".join([packages, *S3A_PACKAGES])
    if schemes & {"gs", "gcs"}:  # the GCS connector jar is the cluster's (Dataproc has it)
        gcs = GcsSettings.from_hadoop(merged).over(GcsSettings.from_env())
        merged = {**gcs.hadoop_conf(), **merged}
        env |= gcs.env()
    if schemes & {"abfs", "abfss", "az"}:  # hadoop-azure's key or token: the cluster's own conf
        azure = AzureSettings.from_hadoop(merged).over(AzureSettings.from_env())
        merged = {**azure.hadoop_conf(), **merged}
        env |= azure.env()
    return SparkApplyJob(
        application=str(spark_jobs_dir() / "apply_changes.py"),
        application_args=[
            *(arg for path in paths for arg in ("--batch", str(path))),
            "--target",
            target,
            *(options or ApplyOptions()).args(),
            *(["--fence", str(fence)] if fence is not None else []),
        ],
        conf=merged,
        name=name or f"airflow-cdc-apply-{paths[0].name}" + (f"-{len(paths)}" if len(paths) > 1 else ""),
        packages=packages,
        jars=jars,
        py_files=None if remote else job_library_zip(),
        env=env,
        remote=remote,
    )


def s3_launch(storage: StorageSettings | None, conf: Mapping[str, str]) -> StorageSettings:
    """The S3 settings an apply job gets: ``storage`` (e.g. from an Airflow Connection), then
    the S3A keys in ``conf`` (``spark.hadoop.fs.s3a.*``), then this process's environment."""
    found = StorageSettings.from_hadoop(conf).over(StorageSettings.from_env())
    return storage.over(found) if storage is not None else found


def launch_defaults(master: str | None = None) -> dict[str, str]:
    """Spark conf the job needs at launch: Delta, and a driver heap that is not Spark's 1 GiB
    default (see :func:`spark_jobs.cdc_apply.layout.default_driver_memory`); no web UI for local
    runs (it costs start-up time and a port per run); no Python call sites recorded per DataFrame
    call (:data:`~spark_jobs.cdc_apply.layout.CALL_SITES_CONF`)."""
    out = {**DELTA_CONF, **CALL_SITES_CONF, "spark.driver.memory": default_driver_memory(master)}
    if master is None or master.startswith("local"):
        out |= {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
        # Spark's start-up INFO lines would bury the job's own progress lines and summary
        log4j = spark_jobs_dir() / "log4j2-warn.properties"
        out["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile=file:{log4j}"
    return out


def _python_env() -> dict[str, str]:
    """Run the job's Python with this interpreter (it has pyarrow and pyspark), unless the
    environment already chooses one.  On a cluster, drop ``env`` or point it at the cluster's
    Python."""
    chosen = {k: os.environ[k] for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON") if k in os.environ}
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, **chosen}


def run_apply_job(
    job: SparkApplyJob,
    *,
    master: str = "local[2]",
    timeout: float | None = None,
    lease: Lease | None = None,
) -> None:
    """Run ``spark-submit`` for ``job`` and wait; its output streams to ours.

    A failed run leaves the batch not, or only partly, applied; re-running it is safe.

    :param lease: the connector lease this run holds; if it is lost (taken over) the job is
        stopped, so two applies never write at once.
    :raises ApplyInterrupted: spark-submit was killed (signal, out of memory, timeout).
    :raises ApplyFailed, BatchError, SchemaError, LeaseLost: see :func:`apply_exit_error`.
    """
    cmd = job.command(master)
    batch = job.batches()
    if job.remote:
        log.info("applying batch %s through Spark Connect at %s", batch, mask_remote(job.remote))
    else:
        log.info("spark-submit %s (batch %s)", job.application, batch)
    proc = subprocess.Popen(cmd, env={**os.environ, **job.env})
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            code = proc.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            pass
        stop = lease is not None and lease.lost is not None
        if stop or (deadline is not None and time.monotonic() > deadline):
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if stop and lease is not None and lease.lost is not None:
                raise lease.lost
            raise ApplyInterrupted(
                f"apply of batch {batch} was stopped after {timeout}s (timeout)",
                hint=f"re-run apply for batch {batch} (idempotent), with a longer timeout",
            )
    if code != 0:
        args = job.application_args
        target = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--target"), None)
        raise apply_exit_error(code, batch, target)


def apply_exit_error(code: int, batch: str, target: str | None = None) -> CdcError:
    """What a non-zero exit of ``spark-submit`` for ``batch`` means, and the one right next step.

    :param code: the exit status: negative for "killed by signal" (Python's convention), 128 + n
        when a shell reports signal n.
    :param target: the Delta root the job wrote (named when the object store failed).
    """
    signo = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if signo is not None:
        try:
            name = signal.Signals(signo).name
        except ValueError:
            name = f"signal {signo}"
        why = " (out of memory or killed by an operator)" if signo == signal.SIGKILL else ""
        return ApplyInterrupted(
            f"apply of batch {batch} was interrupted: spark-submit was killed by {name}{why}",
            hint=f"re-run apply for batch {batch}: it is idempotent and finishes what is missing",
        )
    if code == EXIT_DAMAGED:
        return BatchError(
            f"batch {batch} is damaged: a staged file is missing or unreadable (see the job output)",
            hint="delete the batch directory and re-run capture from the committed offset",
        )
    if code == EXIT_SCHEMA:
        return SchemaError(
            f"batch {batch} changes a column type Delta cannot take; nothing was written (see the job output)"
        )
    if code in (EXIT_MEMORY, SPARK_EXIT_OOM):
        return ApplyFailed(
            f"apply of batch {batch} ran out of memory in the Spark driver (see the job output); "
            "the batch itself is fine",
            hint="give the job more memory (spark.driver.memory, e.g. `--conf spark.driver.memory=8g` or "
            f"the operator's spark_conf), then re-run apply for batch {batch} (idempotent)",
        )
    if code == EXIT_STORAGE:
        return StorageUnavailable(
            f"apply of batch {batch} failed: the object store of the staged batch or of the Delta "
            f"tables{f' ({target})' if target else ''} failed or was unreachable (see the job output)",
            hint=f"check the store's endpoint and credentials, then re-run apply for batch {batch} "
            "(idempotent: a Delta commit is whole or absent)",
        )
    if code == EXIT_REMOTE:
        return ApplyInterrupted(
            f"apply of batch {batch} was interrupted: the Spark Connect server was unreachable or went "
            "away (see the job output)",
            hint=f"check that the server in spark.remote is up, then re-run apply for batch {batch} "
            "(idempotent: it finishes what is missing)",
        )
    if code == EXIT_CATALOG:
        return ConfigError(
            f"apply of batch {batch}: a delta.catalog table name is registered at another location "
            "(see the job output)",
            hint="choose another delta.catalog or delta.catalog.table.format, or drop that catalog table; "
            f"then re-run apply for batch {batch} (idempotent)",
        )
    if code == EXIT_FENCED:
        return LeaseLost(
            f"apply of batch {batch} stopped: a newer run of the connector already wrote its tables"
        )
    return ApplyFailed(f"apply of batch {batch} failed: spark-submit exited with code {code}")


__all__ = ["LAYERS", "table_path"]


def silver_table_path(target: str, connector: str, table: str) -> str:
    return table_path(target, "silver", connector, table)
