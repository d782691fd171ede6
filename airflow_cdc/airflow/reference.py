"""The provider's parameter reference, generated from the classes themselves (signatures and
``:param`` docstrings) into ``docs/reference/operators.md`` by ``scripts/operator_reference.py`` -- one
source of truth."""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

#: the documented classes, in the order of the reference page
CLASSES = (
    "airflow_cdc.airflow.sensors.changes.CdcChangesSensor",
    "airflow_cdc.airflow.operators.capture.CdcCaptureOperator",
    "airflow_cdc.airflow.operators.apply.CdcApplyOperator",
    "airflow_cdc.airflow.operators.commit.CdcCommitOperator",
    "airflow_cdc.airflow.operators.verify.CdcVerifyOperator",
    "airflow_cdc.airflow.operators.snapshot_parts.CdcSnapshotPlanOperator",
    "airflow_cdc.airflow.operators.snapshot_parts.CdcSnapshotPartOperator",
    "airflow_cdc.airflow.triggers.changes.CdcChangesTrigger",
    "airflow_cdc.airflow.hooks.cdc.CdcHook",
)
_PARAM = re.compile(r":param (\w+):\s*(.*?)(?=\n\s*:(?:param|raises|returns)|\Z)", re.S)


def _load(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _markdown(text: str) -> str:
    """reST inline markup as Markdown: roles and double backquotes become code spans."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return " ".join(text.replace("``", "`").split())


def params_doc(cls: type) -> dict[str, str]:
    """``:param`` texts of the class docstring and its ``__init__`` docstring, one line each."""
    text = (cls.__doc__ or "") + "\n" + (vars(cls).get("__init__", object.__init__).__doc__ or "")
    return {m.group(1): _markdown(m.group(2)) for m in _PARAM.finditer(text)}


def _default(p: inspect.Parameter) -> str:
    if p.default is inspect.Parameter.empty:
        return "required"
    return f"`{p.default!r}`"


def reference() -> str:
    """Markdown: per class, a table of its own parameters (default, description); the rest are
    Airflow's ``BaseOperator`` / ``SparkSubmitOperator`` arguments."""
    out = []
    for path in CLASSES:
        cls = _load(path)
        docs = params_doc(cls)
        summary = _markdown((cls.__doc__ or "").strip().split("\n\n", 1)[0])
        out.append(f"#### `{path.split('airflow_cdc.airflow.', 1)[1]}`\n\n{summary}\n")
        out.append("| parameter | default | what it does |\n|---|---|---|")
        params = [
            p
            for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
        for p in params:
            out.append(f"| `{p.name}` | {_default(p)} | {docs.get(p.name, '').replace('|', '/')} |")
        out.append("")
    return "\n".join(out)
