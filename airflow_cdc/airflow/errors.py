"""Map core errors onto Airflow's retry behaviour.

Retryable errors (connection blips) are re-raised as :class:`AirflowException` so the task's
``retries`` apply; errors a retry cannot fix (configuration, privileges, server settings, a lost
compare-and-set) fail the task at once with :class:`AirflowFailException`.  The message keeps the
operator hint; the cause chain keeps the original error.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_cdc.core.errors import CdcError, Disposition, StateConflict


@contextmanager
def airflow_errors(what: str) -> Iterator[None]:
    """Translate :class:`CdcError` raised inside the block; ``what`` names the step in the message."""
    try:
        yield
    except StateConflict as e:  # another run committed first: retrying this batch can never succeed
        raise AirflowFailException(f"{what}: {e}") from e
    except CdcError as e:
        if e.retryable:
            raise AirflowException(f"{what}: {e}") from e
        raise AirflowFailException(f"{what} failed ({_WHY[e.disposition]}): {e}") from e


#: why a failure is not retried, in words an on-call engineer reads at 3 a.m.
_WHY = {
    Disposition.NEEDS_OPERATOR: "not retried: a person must act first",
    Disposition.FATAL: "not retried: the input or configuration can never work as given",
    Disposition.RETRYABLE: "retryable",
}
