"""Apply staged airflow-cdc batches to Delta Lake (bronze change log + silver mirror).

Run with plain ``spark-submit`` (this is what ``SparkSubmitOperator`` and ``airflow-cdc apply``
do; ``airflow_cdc.apply.submit.build_apply_job`` builds the call)::

    spark-submit --packages io.delta:delta-spark_4.2_2.13:4.4.0 \\
        --py-files cdc_apply.zip spark_jobs/apply_changes.py --batch DIR [--batch DIR ...] \\
        --target DELTA_ROOT

Several ``--batch``: consecutive batches of one connector (partition), oldest first; each table's
stretch of them is applied in one pass (``cdc_apply/backlog.py``), with the result of applying
them one by one.  Re-running it for a batch that is already (fully or partly) applied is safe and
changes nothing that is already there.  Exit code 0 on success (the last stdout line is a JSON
report); 3: a staged file is missing or unreadable; 4: a column type change Delta cannot take;
5: a newer run of the connector (higher ``--fence`` token) already wrote a table; 6: the driver
ran out of memory (the batch is fine: give it more ``spark.driver.memory``); 7: the object store
failed; 8: the Spark Connect server (``--remote``) was unreachable or went away; 9: a ``--catalog`` name
is registered at another location; 1: anything else.
The last stderr line then says ``airflow-cdc apply: <what>: <message>``.
"""

from __future__ import annotations

import time

STARTED_AT = time.time()  # the Python side of the driver starts (the JVM is up by now)

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cdc_apply.catalog import CatalogError  # noqa: E402
from cdc_apply.delta_log import StaleFence  # noqa: E402
from cdc_apply.frames import SchemaChangeError  # noqa: E402
from cdc_apply.job import ApplySettings, apply_batches  # noqa: E402
from cdc_apply.layout import (  # noqa: E402
    EXIT_CATALOG,
    EXIT_DAMAGED,
    EXIT_FENCED,
    EXIT_MEMORY,
    EXIT_REMOTE,
    EXIT_SCHEMA,
    EXIT_STORAGE,
)
from cdc_apply.session import remote as remote_session  # noqa: E402
from cdc_apply.session import tune  # noqa: E402
from cdc_apply.staged import StagedBatchError  # noqa: E402

#: error class -> (exit code, what it is), most specific first
_EXITS = (
    (StagedBatchError, EXIT_DAMAGED, "staged batch damaged"),
    (SchemaChangeError, EXIT_SCHEMA, "schema change refused"),
    (StaleFence, EXIT_FENCED, "fenced out by a newer run"),
    (CatalogError, EXIT_CATALOG, "catalog name taken"),
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--batch",
        action="append",
        required=True,
        help="published batch directory (has manifest.json); repeat for consecutive batches, oldest first",
    )
    p.add_argument("--target", required=True, help="Delta root: <target>/<layer>/<connector>/<table>")
    p.add_argument("--delete-mode", choices=["delete", "soft"], default="delete")
    p.add_argument("--no-bronze", action="store_true", help="skip the bronze change log")
    p.add_argument(
        "--deletion-vectors",
        action=argparse.BooleanOptionalAction,
        default=ApplySettings.deletion_vectors,
        help="new silver/tombstone tables with deletion vectors (default; --no-deletion-vectors: without)",
    )
    p.add_argument(
        "--no-bronze-copy",
        action="store_true",
        help="re-encode bronze events instead of adding the staged files",
    )
    p.add_argument(
        "--rewrite-ratio",
        type=float,
        default=ApplySettings.rewrite_ratio,
        help="rewrite a silver table instead of MERGE when events >= ratio x stored rows (0: never)",
    )
    p.add_argument(
        "--optimize-interval",
        type=int,
        default=ApplySettings.optimize_interval,
        help="OPTIMIZE silver and tombstone tables after every N batches that wrote them (0: never)",
    )
    p.add_argument("--fence", type=int, default=None, help="the submitter's lease token (fencing)")
    p.add_argument("--catalog", default=None, help="register the tables in this catalog namespace")
    p.add_argument("--catalog-format", default=None, help="catalog table name template ({layer}_{table})")
    p.add_argument(
        "--remote",
        default=None,
        help="a Spark Connect server (sc://host:port): run as its client, without a JVM here",
    )
    p.add_argument(
        "--conf", action="append", default=[], help="KEY=VALUE session conf (with --remote: set at runtime)"
    )
    p.add_argument("--history", action="append", default=[], help="regex of tables with SCD2 history")
    p.add_argument(
        "--history-except", action="append", default=[], help="regex of <table>.<column> not tracked"
    )
    args = p.parse_args(argv)
    args.remote = args.remote or os.environ.get("SPARK_REMOTE") or None  # a URL with a token comes so
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    session_start = time.time()
    more = f" and {len(args.batch) - 1} more" if len(args.batch) > 1 else ""
    name = f"airflow-cdc-apply {os.path.basename(args.batch[0].rstrip('/'))}{more}"
    try:
        spark = _session(name, args.remote, args.conf)
    except Exception as e:
        if args.remote and _remote_lost(e):
            where = _masked(args.remote)
            print(f"airflow-cdc apply: Spark Connect server unreachable ({where}): {e}", file=sys.stderr)
            return EXIT_REMOTE
        raise
    tune(spark)
    session_seconds = time.time() - session_start
    settings = ApplySettings(
        args.delete_mode,
        not args.no_bronze,
        args.rewrite_ratio,
        args.fence,
        tuple(args.history),
        tuple(args.history_except),
        not args.no_bronze_copy,
        args.optimize_interval,
        args.deletion_vectors,
        args.catalog or None,
        args.catalog_format or ApplySettings.catalog_format,
    )
    try:
        report = apply_batches(spark, args.batch, args.target, settings)
    except Exception as e:
        for kind, code, what in _EXITS:
            if isinstance(e, kind):
                logging.getLogger("airflow_cdc.apply").exception("apply failed")
                print(f"airflow-cdc apply: {what}: {e}", file=sys.stderr)
                return code
        if _out_of_memory(e):
            logging.getLogger("airflow_cdc.apply").exception("apply failed")
            memory = spark.conf.get("spark.driver.memory", "1g (Spark's default)")
            print(f"airflow-cdc apply: out of memory (spark.driver.memory={memory}): {e}", file=sys.stderr)
            return EXIT_MEMORY
        if args.remote and _remote_lost(e):
            logging.getLogger("airflow_cdc.apply").exception("apply failed")
            where = _masked(args.remote)
            print(f"airflow-cdc apply: Spark Connect server lost ({where}): {e}", file=sys.stderr)
            return EXIT_REMOTE
        if _store_failed(e):
            logging.getLogger("airflow_cdc.apply").exception("apply failed")
            print(f"airflow-cdc apply: object store failed or unreachable: {e}", file=sys.stderr)
            return EXIT_STORAGE
        raise
    report["timings"] = {
        "python_started_at": round(STARTED_AT, 3),
        "session_seconds": round(session_seconds, 3),
        "finished_at": round(time.time(), 3),
    }
    print(json.dumps(report, sort_keys=True, default=str))
    return 0


def _session(name: str, remote: str | None, conf: list[str]) -> Any:
    """The job's session: ``spark-submit``'s, or a Spark Connect client's of ``remote`` (with
    ``conf`` set on it: runtime settings only; launch settings are the server's)."""
    from pyspark.sql import SparkSession

    if not remote:
        return SparkSession.builder.appName(name).getOrCreate()
    return remote_session(remote, dict(item.partition("=")[::2] for item in conf))


def _masked(url: str) -> str:
    return re.sub(r"(?i)(;token=)[^;]*", r"\1****", url)


#: what a Spark Connect client raises when the server is gone, restarted or unreachable: gRPC
#: UNAVAILABLE after its retries, or a session the new server does not know
_REMOTE_LOST = (
    "StatusCode.UNAVAILABLE",
    "SESSION_CHANGED",
    "SESSION_NOT_FOUND",
    "NO_ACTIVE_SESSION",
    "failed to connect to all addresses",
    "Connection refused",
    "Socket closed",
    "RetriesExceeded",
)


def _remote_lost(error: BaseException | None) -> bool:
    """Whether losing the Spark Connect server caused ``error`` (a re-run is what helps)."""
    while error is not None:
        text = f"{type(error).__name__}: {error}"
        if any(sign in text for sign in _REMOTE_LOST):
            return True
        error = error.__cause__ or error.__context__
    return False


#: what S3A (Java) and pyarrow (C++) say when the store is down, throttles or refuses a request
_STORE_FAILURES = (
    "org.apache.hadoop.fs.s3a.",
    "software.amazon.awssdk.core.exception.SdkClientException",
    "AWSClientIOException",
    "AWS Error NETWORK_CONNECTION",
    "AWS Error SLOW_DOWN",
    "AWS Error SERVICE_UNAVAILABLE",
)


def _store_failed(error: BaseException | None) -> bool:
    """Whether an object-store failure caused ``error`` (a retry of the batch is what helps)."""
    while error is not None:
        if any(sign in str(error) for sign in _STORE_FAILURES):
            return True
        error = error.__cause__ or error.__context__
    return False


def _out_of_memory(error: BaseException) -> bool:
    """Whether a JVM ``OutOfMemoryError`` caused ``error`` (Spark wraps it in task and job
    failures; its name survives in the message of every wrapper)."""
    while error is not None:
        if "java.lang.OutOfMemoryError" in str(error):
            return True
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return False


if __name__ == "__main__":
    sys.exit(main())
