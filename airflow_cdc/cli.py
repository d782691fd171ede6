"""``airflow-cdc`` command line: run captures and inspect state without Airflow.

airflow-cdc capture --config pipeline.yaml [--commit] [--signal JSON]...
airflow-cdc commit  --config pipeline.yaml --batch DIR
airflow-cdc status  --config pipeline.yaml [--json] [--offline]
airflow-cdc apply   --config pipeline.yaml [--batch DIR]... [--target DELTA_ROOT] [--commit]
airflow-cdc verify  --config pipeline.yaml [--target DELTA_ROOT] [--table T]...
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from airflow_cdc.core.batch import Batch, list_batches
from airflow_cdc.core.capture import Capture
from airflow_cdc.core.errors import CdcError, ConfigError
from airflow_cdc.core.pipeline import build_capture, build_captures, build_config, read_pipeline_file
from airflow_cdc.core.redact import secrets_in

log = logging.getLogger("airflow_cdc.cli")


def _print(doc: Any) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True, default=str))


def cmd_capture(args: argparse.Namespace) -> int:
    config = build_config(read_pipeline_file(args.config))
    if args.commit:
        from airflow_cdc.apply.applied import delta_target

        if delta_target(config) is not None:  # --commit skips apply: only capture-only pipelines may
            raise ConfigError(
                f"capture --commit would move the offset of {config['name']!r} past data never applied "
                f"to {delta_target(config)}: use `apply --commit` after capture, or set "
                "commit.require.applied=false if this pipeline only captures"
            )
    signals = [json.loads(s) for s in args.signal]
    results = {}
    for capture in _captures(config, args.partition):  # partitions one after the other
        results[capture.config.partition] = capture.run(signals=signals, commit=args.commit).summary()
    _print(_by_partition(results))
    return 0


def _captures(config: Any, partition: str | None) -> list[Capture]:
    """The capture runners of the named partition, or of every partition of the connector."""
    if partition is not None:
        return [build_capture(config, partition)]
    return build_captures(config)


def _by_partition(results: dict[str | None, Any]) -> Any:
    """One run's output as is; several partitions' outputs keyed by partition."""
    return results[None] if list(results) == [None] else {"partitions": results}


def cmd_commit(args: argparse.Namespace) -> int:
    from airflow_cdc.apply.applied import ensure_applied

    config = build_config(read_pipeline_file(args.config))
    batch = Batch(args.batch)
    capture = build_capture(config, batch.partition)
    with capture.leases.hold("commit"):
        ensure_applied(batch, config, args.target)
        version = capture.commit(batch)
    _print({"committed": args.batch, "state_version": version})
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from airflow_cdc.core.health import status_metrics

    config = build_config(read_pipeline_file(args.config))
    results = {}
    for capture in _captures(config, args.partition):
        stored = capture.store.load(capture.name)
        batches = list_batches(config["staging.path"], capture.name)
        state = stored.data if stored else None
        results[capture.config.partition] = {
            "connector": config["name"],
            **({"partition": capture.config.partition} if capture.config.partition else {}),
            "state_store": capture.store.describe(),
            "state_version": stored.version if stored else None,
            "updated_at": stored.updated_at if stored else None,
            "state": stored.data if stored else None,
            "staged_batches": len(batches),
            "newest_batch": batches[-1].batch_id if batches else None,
            "metrics": status_metrics(capture.config, state, live=not args.offline),
        }
    _print(_by_partition(results))
    return 0


def _target(args: argparse.Namespace, config: Any) -> str:
    target = args.target or config["delta.root"]
    if not target:
        raise ConfigError("no Delta target: pass --target or set delta.root in the pipeline file")
    return str(target)


def _overtaken(batches: list[Batch]) -> set[str]:
    """Staged batches that a later one replaced: captured from the same state version (a run
    that died after publishing its batch, then its retry).  Only the last of them is committed,
    as the retry would have been; committing the first would refuse the retry and every batch
    captured after it (their state versions follow the retry's)."""
    by_version: dict[Any, str] = {}
    for batch in batches:  # in batch-id (capture) order
        by_version[batch.manifest.get("state_version")] = batch.batch_id
    return {b.batch_id for b in batches if by_version[b.manifest.get("state_version")] != b.batch_id}


def cmd_apply(args: argparse.Namespace) -> int:
    from airflow_cdc.apply.applied import ensure_applied, missing_tables
    from airflow_cdc.apply.submit import ApplyOptions, build_apply_job, run_apply_job
    from airflow_cdc.core.step_metrics import record_apply

    config = build_config(read_pipeline_file(args.config))
    options = ApplyOptions.from_config(config)
    target = _target(args, config)
    given = [Batch(b) for b in args.batch]
    captures = _captures(config, args.partition)
    stray = [b.batch_id for b in given if b.partition not in {c.config.partition for c in captures}]
    if stray:
        raise ConfigError(f"batch(es) {', '.join(stray)} belong to no partition of {config['name']!r} here")
    if args.batches_per_job < 1:
        raise ConfigError(f"--batches-per-job must be at least 1, not {args.batches_per_job}")
    applied, skipped = [], []
    for capture in captures:
        mine = [b for b in given if b.partition == capture.config.partition]
        batches = mine if given else list_batches(config["staging.path"], capture.name)
        if not batches:
            continue
        conf = _spark_conf(args)
        with capture.leases.hold("apply") as lease:  # one lease over every apply and commit of this call
            todo = [
                i
                for i, batch in enumerate(batches)
                if batch.manifest.get("messages")
                or missing_tables(batch, target, config["delta.bronze.enabled"], options.history_tables())
            ]
            needed = set(todo)
            # batches up to the last committed one are committed (kept by staging.retention.batches)
            # or were overtaken by it: committing them again is refused, so only newer ones are
            stored = capture.store.load(capture.name)
            last = stored.data.get("last_batch") if stored is not None else None
            version = stored.version if stored is not None else None
            overtaken = _overtaken(batches) if args.commit else set()
            skipped += [b.batch_id for i, b in enumerate(batches) if i not in needed]
            # one job per run of consecutive batches (a table's stretch of them is applied in one
            # pass), from the first batch that misses a mark to the last one: the job skips what
            # is already there, and a stretch never spans a batch it was not given
            start, end = (todo[0], todo[-1] + 1) if todo else (len(batches), len(batches))
            runs = [
                (batches[i : i + args.batches_per_job], True) for i in range(start, end, args.batches_per_job)
            ]
            for run, spark_job in [(batches[:start], False), *runs, (batches[end:], False)]:
                if spark_job:
                    job = build_apply_job(
                        [b.path for b in run],
                        target,
                        options=options,
                        conf=conf,
                        fence=lease.token,
                        master=args.master,
                        remote=args.remote or config["spark.remote"] or None,
                    )
                    started = time.monotonic()
                    run_apply_job(job, master=args.master, lease=lease)
                    try:
                        record_apply(capture.config, [b.manifest for b in run], time.monotonic() - started)
                    except Exception as e:  # noqa: BLE001 - metrics must never fail the apply
                        log.warning("apply metrics not recorded: %s", e)
                for batch in run:
                    if args.commit and (last is None or batch.batch_id > last):
                        if batch.batch_id in overtaken or batch.manifest.get("state_version") != version:
                            log.warning(
                                "batch %s is not committed: it was captured from state version %s, and "
                                "%s (its changes are applied; captures go on from the committed offset)",
                                batch.batch_id,
                                batch.manifest.get("state_version"),
                                "a later batch was captured from that version too"
                                if batch.batch_id in overtaken
                                else f"{capture.name!r} is at version {version}",
                            )
                        else:
                            ensure_applied(batch, config, target)
                            version = capture.commit(batch)
                            last = batch.batch_id
                    applied.append(batch.batch_id)
    _print({"applied": applied, "without_spark": skipped, "target": target, "committed": args.commit})
    return 0


def _spark_conf(args: argparse.Namespace) -> dict[str, str]:
    """``--conf KEY=VALUE`` options (over the job's defaults, e.g. ``spark.driver.memory=8g``)."""
    out = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--conf {item!r}: expected KEY=VALUE, e.g. spark.driver.memory=4g")
        out[key.strip()] = value
    return out


def cmd_verify(args: argparse.Namespace) -> int:
    from airflow_cdc.apply.verify import verify

    config = build_config(read_pipeline_file(args.config))
    report = verify(
        config,
        _target(args, config),
        tables=args.table or None,
        chunk=args.chunk,
        chunk_bytes=args.chunk_bytes,
        conf=_spark_conf(args),
    )
    _print(report.to_json())
    return 0 if report.ok else 1


_PARTITION_HELP = (
    "only this partition of a partitioned connector (a database of a SQL Server database.names); "
    "default: every partition, one after the other"
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="airflow-cdc", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("capture", help="capture one change window (and snapshot chunks) into a staged batch")
    c.add_argument("--config", required=True, help="pipeline file (YAML/JSON of Debezium properties)")
    c.add_argument("--commit", action="store_true", help="commit the batch right away (no apply step)")
    c.add_argument(
        "--signal",
        action="append",
        default=[],
        help="execute-snapshot / stop-snapshot signal as JSON, e.g. "
        '\'{"type":"execute-snapshot","data":{"data-collections":["public.t"]}}\'',
    )
    c.add_argument("--partition", help=_PARTITION_HELP)
    c.set_defaults(func=cmd_capture)
    m = sub.add_parser("commit", help="commit a staged batch: store its end offset, acknowledge the source")
    m.add_argument("--config", required=True)
    m.add_argument("--batch", required=True, help="batch directory")
    m.add_argument("--target", help="Delta root the batch was applied to (default: delta.root)")
    m.set_defaults(func=cmd_commit)
    s = sub.add_parser("status", help="show the stored state, staged batches and metrics")
    s.add_argument("--config", required=True)
    s.add_argument("--json", action="store_true", help="print JSON (the only format)")
    s.add_argument(
        "--offline",
        action="store_true",
        help="do not reach the source: metrics as the last steps saved them, without the live "
        "retained log and guard",
    )
    s.add_argument("--partition", help=_PARTITION_HELP)
    s.set_defaults(func=cmd_status)
    a = sub.add_parser(
        "apply", help="apply staged batches to Delta with spark-submit, or through a Spark Connect server"
    )
    a.add_argument("--config", required=True)
    a.add_argument("--batch", action="append", default=[], help="batch directory (default: all staged)")
    a.add_argument("--target", help="Delta root (default: delta.root)")
    a.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    a.add_argument(
        "--remote",
        help="Spark Connect server sc://host:port to apply through as its client (default: spark.remote; "
        "neither: spark-submit to --master)",
    )
    a.add_argument("--commit", action="store_true", help="commit each batch after it is applied")
    a.add_argument(
        "--batches-per-job",
        type=int,
        default=20,
        help="apply up to this many consecutive batches in one Spark job, each table's stretch of "
        "them in one pass (default 20; 1: a job per batch)",
    )
    a.add_argument("--partition", help=_PARTITION_HELP)
    a.add_argument("--conf", action="append", default=[], help="Spark conf KEY=VALUE over the defaults")
    a.set_defaults(func=cmd_apply)
    v = sub.add_parser("verify", help="compare silver tables with the live source (counts + row hashes)")
    v.add_argument("--config", required=True)
    v.add_argument("--target", help="Delta root (default: delta.root)")
    v.add_argument("--table", action="append", default=[], help="only this table (repeatable)")
    v.add_argument("--chunk", type=int, default=50_000, help="at most this many source rows per chunk")
    v.add_argument("--chunk-bytes", type=int, default=64 << 20, help="about this many source bytes per chunk")
    v.add_argument("--conf", action="append", default=[], help="Spark conf KEY=VALUE over the defaults")
    v.set_defaults(func=cmd_verify)
    return p


class _Scrubbed(logging.Formatter):
    """Formats records (tracebacks included), then masks every known secret in the text."""

    def __init__(self, fmt: str, secrets: list[str]) -> None:
        super().__init__(fmt)
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        return scrub(super().format(record), self.secrets)


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with each secret replaced by ``****`` (longest first, so no fragment survives)."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, "****")
    return text


def _pipeline_secrets(args: argparse.Namespace) -> list[str]:
    try:
        return secrets_in(read_pipeline_file(args.config))
    except (CdcError, AttributeError):
        return []


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    secrets = _pipeline_secrets(args)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Scrubbed("%(asctime)s %(levelname)s %(name)s: %(message)s", secrets))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, handlers=[handler])
    try:
        return args.func(args)
    except CdcError as e:
        print(scrub(f"error: {e}", secrets), file=sys.stderr)
        return 75 if e.retryable else 2  # EX_TEMPFAIL: a scheduler may simply try again later
    except Exception:  # a driver error from the state store or the source: never show its secrets
        logging.getLogger("airflow_cdc.cli").exception("unexpected error")
        return 1


if __name__ == "__main__":
    sys.exit(main())
