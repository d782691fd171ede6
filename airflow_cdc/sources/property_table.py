"""The per-connector property table: every property a connector defines or the Debezium docs document.

One source of truth: supported rows come from the connector's :class:`Property` tuple, ignored and
refused rows from :mod:`airflow_cdc.core.property_status` or, for connector-specific refusals
(``schema.include.list`` on MySQL), from the error the connector's config function raises.
``scripts/property_table.py`` writes the tables into ``docs/reference/properties/``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from airflow_cdc.core.config import Property
from airflow_cdc.core.errors import ConfigError
from airflow_cdc.core.property_status import handling
from airflow_cdc.core.source import SourceSpec, resolve_connector

#: Connectors with a table, and the smallest valid configuration of each.
BASE_CONFIGS: dict[str, dict[str, Any]] = {
    "postgresql": {"name": "c", "staging.path": "/tmp/s"},
    "mysql": {"name": "c", "staging.path": "/tmp/s"},
    "sqlserver": {"name": "c", "staging.path": "/tmp/s", "database.names": "db"},
    "vitess": {"name": "c", "staging.path": "/tmp/s", "vitess.keyspace": "ks"},
}


@dataclass(frozen=True)
class Row:
    """One table row: ``status`` is ``supported``, ``ignored`` or ``refused``."""

    name: str
    status: str
    default: str
    text: str


def _spec(connector: str) -> SourceSpec:
    return resolve_connector({"connector": connector})[1]


def properties(connector: str) -> tuple[Property, ...]:
    """The connector's supported properties, in definition order."""
    config = _spec(connector).build_config(BASE_CONFIGS[connector])
    return tuple(config.properties.values())


def concrete(name: str) -> str:
    """A concrete property name for a templated one (``<length>`` -> ``10``, ``<table>`` -> ``s.t``)."""
    return re.sub(r"<[a-z]+>", lambda m: {"<length>": "10", "<table>": "s.t"}.get(m.group(0), "x"), name)


def _supported(prop: Property) -> Row:
    if prop.required:
        default = "(required)"
    elif prop.default in (None, ()):
        default = "—" if prop.default is None else "(empty)"
    elif isinstance(prop.default, tuple):
        default = ",".join(prop.default)
    else:
        default = str(prop.default)
    text = prop.doc
    if prop.choices:
        text = f"{text} {', '.join(f'`{c}`' for c in prop.choices)}".strip()
    return Row(prop.name, "supported", default, text)


def _undefined(connector: str, name: str) -> Row:
    known = handling(concrete(name))
    if known is not None:
        return Row(name, known.status, "", known.reason)
    try:
        _spec(connector).build_config({**BASE_CONFIGS[connector], concrete(name): "x"})
    except ConfigError as e:
        if "unknown property" in str(e):
            raise AssertionError(f"{connector}: documented property {name!r} has no status") from e
        return Row(name, "refused", "", str(e))
    raise AssertionError(f"{connector}: property {name!r} neither defined nor refused")  # pragma: no cover


def rows(connector: str, documented: Iterable[str]) -> list[Row]:
    """Supported properties in definition order, then the other documented names sorted."""
    props = properties(connector)
    defined = {p.name for p in props}
    out = [_supported(p) for p in props]
    out += [_undefined(connector, n) for n in sorted(set(documented) - defined)]
    return out


def markdown(connector: str, documented: Iterable[str]) -> str:
    """The connector's table as Markdown."""
    lines = ["| property | status | default | values / meaning / reason |", "|---|---|---|---|"]
    for row in rows(connector, documented):
        default = f"`{row.default}`" if row.default else ""
        text = row.text.replace("|", "\\|")
        lines.append(f"| `{row.name}` | {row.status} | {default} | {text} |")
    return "\n".join(lines)
