"""Extract every Debezium property name a seed documents into ``docs/seed_properties/<connector>.txt``.

Run once (kept so the lists can be rebuilt)::

    python scripts/seed_properties.py /work/shared/seeds <pages>

where ``<pages>`` holds the upstream ``postgresql.adoc``, ``sqlserver.adoc``, ``vitess.adoc`` and a
``mysql.adoc`` that is the MariaDB/MySQL property partials (``ref-mariadb-mysql-*-cfg-props.adoc``)
followed by the page (debezium/debezium, ``documentation/modules/ROOT``).

The Chinese seeds lost the first column (the property name) of their property tables; the upstream
English pages have the same rows in the same order, so the names are taken from their property rows
(``[[<connector>-property-...]]`` / ``xref:{context}-property-...``).  The upstream pages are newer
than some seeds, so a list may hold a few properties a seed lacks (a superset, never fewer).
Property names the seed mentions in its prose (``slot.drop.on.stop``) are added when the upstream
page quotes them too, minus example tables and server settings.  Templated names are normalised
(``column.truncate.to.20.chars`` becomes ``column.truncate.to.<length>.chars``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

#: seed file -> (connector list name, upstream page); the MySQL seeds are versioned, so their
#: pages are those of the same Debezium branch (``git show 1.9:.../mysql.adoc``), plus the newest
SEEDS = {
    "debezium-postgresql.zh.txt": ("postgresql", "postgresql.adoc"),
    "debezium-mysql-1.9.zh.txt": ("mysql", "mysql-1.9.adoc"),
    "debezium-mysql-2.3.zh.txt": ("mysql", "mysql-2.3.adoc"),
    "debezium-mysql.zh.txt": ("mysql", "mysql.adoc"),
    "debezium-sqlserver.zh.txt": ("sqlserver", "sqlserver.adoc"),
    "debezium-vitess.zh.txt": ("vitess", "vitess.adoc"),
}

_ROW = re.compile(
    r"^(?:\|\[\[[a-z]+-property-[a-z0-9-]+\]\]<<[^,]*,\s*|xref:\{context\}-property-[a-z0-9-]+\[)`\+?([^`+]+)",
    re.M,
)
_DOTTED = re.compile(r"\b[a-z][a-z0-9_]*(?:\.[a-z0-9_<>]+)+\b")
_OVERRIDE = "snapshot.select.statement.overrides.<table>"
_TEMPLATES = (
    (re.compile(r"^column\.truncate\.to\.\d+\.chars$"), "column.truncate.to.<length>.chars"),
    (re.compile(r"^column\.truncate\.to\._length_\.chars$"), "column.truncate.to.<length>.chars"),
    (re.compile(r"^column\.mask\.with\.(\d+|_length_|<length>)\.chars$"), "column.mask.with.<length>.chars"),
    (re.compile(r"^column\.mask\.hash\..*"), "column.mask.hash.<algorithm>.with.salt.<salt>"),
    (re.compile(r"^bigint\.unsigned\.handling\.mode\.mode$"), "bigint.unsigned.handling.mode"),  # doc typo
    (re.compile(r"^snapshot\.select\.statement\.overrides\..+"), _OVERRIDE),
)


#: Quoted in the upstream pages but not properties: example tables, server settings, event fields.
_NOT_PROPERTIES = re.compile(
    r"^(customers?|fulfillment|inventory|dbo|john|payload|quay|pg_hba|postgresql|rds|cloudsql|azure)\."
    r"|^(transaction\.id|source\.vgtid)$"
)


def normalise(name: str) -> str:
    """Return the templated form of a concrete property name (``column.truncate.to.20.chars``)."""
    name = name.strip().rstrip(".")
    for pattern, template in _TEMPLATES:
        if pattern.match(name):
            return template
    return name


def upstream_names(page: str) -> set[str]:
    """Property names of the upstream page's property tables."""
    return {normalise(n) for n in _ROW.findall(page)}


def seed_names(seed: str, page: str) -> set[str]:
    """Names of the seed: the upstream table rows plus prose mentions the upstream page confirms."""
    names = upstream_names(page)
    quoted = {normalise(n) for n in re.findall(r"`\+?([a-z][a-z0-9_.<>-]+)", page)}
    for mention in _DOTTED.findall(seed):
        name = normalise(mention)
        code = name.startswith(("io.", "org.", "java."))
        if name in quoted and not code and not _NOT_PROPERTIES.match(name):
            names.add(name)
    return names


def main(seeds_dir: str, upstream_dir: str, out_dir: str = "docs/seed_properties") -> None:
    found: dict[str, set[str]] = {}
    for seed_file, (connector, page_file) in SEEDS.items():
        seed_path = Path(seeds_dir) / seed_file
        seed = seed_path.read_text(encoding="utf-8") if seed_path.exists() else ""
        page = (Path(upstream_dir) / page_file).read_text(encoding="utf-8")
        found.setdefault(connector, set()).update(seed_names(seed, page))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for connector, names in found.items():
        text = "\n".join(sorted(names)) + "\n"
        (Path(out_dir) / f"{connector}.txt").write_text(text, encoding="utf-8")
        print(f"{connector}: {len(names)} properties")


if __name__ == "__main__":
    main(*sys.argv[1:])
