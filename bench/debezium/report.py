"""The result of ``bench/vs_debezium.py``: each case's runs on both sides, and their report."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from bench._common import log, median
from bench.debezium.engine import Build, Measured


@dataclass
class Case:
    """One case's runs on both sides (one per repeat), or why it was skipped; ``build`` is the
    Debezium set it runs."""

    name: str
    build: Build
    ours: list[Measured] = field(default_factory=list)
    theirs: list[Measured] = field(default_factory=list)
    skipped: str = ""


def middle(runs: list[Measured]) -> Measured:
    """The median of every field over the repeats."""
    values = [median([getattr(r, f.name) for r in runs]) for f in dataclasses.fields(Measured)]
    return Measured(int(values[0]), *values[1:])


def report(cases: list[Case], note: str) -> None:
    """The table (medians over the repeats), a line of ratios per case, then the headline."""
    log(f"Debezium: {note}")
    print(
        "| case | side | events | seconds | events/s | start-up s | CPU s (timed / process) | peak RSS MiB "
        "| written MiB |\n|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    measured = [(c, middle(c.ours), middle(c.theirs)) for c in cases if not c.skipped]
    for case, ours, theirs in measured:
        for side, m in (("ours", ours), (f"Debezium {case.build.version}", theirs)):
            print(
                f"| {case.name} | {side} | {m.events:,} | {m.elapsed_s:.2f} | {m.rate:,.0f} "
                f"| {m.startup_s:.2f} | {m.cpu_s:.2f} / {m.total_cpu_s:.2f} | {m.rss_mib:,.0f} "
                f"| {m.out_mib:,.1f} |"
            )
    for case in cases:
        if case.skipped:
            print(f"| {case.name} | Debezium {case.build.version} | skipped: {case.skipped} | | | | | | |")
    ratios = {case.name: (ours.rate / theirs.rate, ours, case.build) for case, ours, theirs in measured}
    for case, ours, theirs in measured:
        met = ours.rate >= 3 * theirs.rate and ours.rss_mib < theirs.rss_mib
        print(
            f"{case.name}: ours / Debezium: events/s {ours.rate / theirs.rate:.2f}, peak RSS "
            f"{ours.rss_mib / theirs.rss_mib:.2f}, CPU s timed {ours.cpu_s / theirs.cpu_s:.2f}, "
            f"whole process {ours.total_cpu_s / theirs.total_cpu_s:.2f} "
            f"(issue 36's bar: {'met' if met else 'NOT met'})"
        )
    if not ratios:
        print("vs_debezium: no case measured", flush=True)
        return
    worst = min(ratios, key=lambda name: ratios[name][0])
    ratio, ours, build = ratios[worst]
    print(
        f"vs_debezium: {worst} {ours.rate:.0f} events/s; ratio {ratio:.2f} vs Debezium {build.version}",
        flush=True,
    )
