"""One exception hierarchy for the whole product.

Every error carries a *disposition* that tells the orchestrator what to do with it:

* ``retryable``       -- transient (network blip, serialization failure); retry the run as is.
* ``needs_operator``  -- the environment is wrong (credentials, privileges, server settings,
                         missing publication); retrying will fail the same way until a human acts.
* ``fatal``           -- the data or configuration can never be processed as given.

Each error also carries a one-line ``hint`` for the operator.  Raise with ``from`` so the
driver's original exception stays in the chain.  Messages never contain secrets.
"""

from __future__ import annotations

from enum import Enum


class Disposition(str, Enum):
    RETRYABLE = "retryable"
    NEEDS_OPERATOR = "needs_operator"
    FATAL = "fatal"


class CdcError(Exception):
    """Base class: ``str(err)`` is the message, ``err.hint`` what the operator should do."""

    disposition: Disposition = Disposition.FATAL
    default_hint: str = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint if hint is not None else self.default_hint

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} (hint: {self.hint})" if self.hint else base

    @property
    def retryable(self) -> bool:
        return self.disposition is Disposition.RETRYABLE


class ConfigError(CdcError):
    """A configuration property is missing, unknown or has an invalid value."""

    disposition = Disposition.FATAL
    default_hint = (
        "fix the connector configuration; see the configuration reference in docs/reference/properties/"
    )


class ConnectionFailed(CdcError):
    """The source could not be reached (network, server down)."""

    disposition = Disposition.RETRYABLE
    default_hint = "check that the database server is running and reachable"


class AuthenticationFailed(CdcError):
    """The source rejected the credentials."""

    disposition = Disposition.NEEDS_OPERATOR
    default_hint = "verify the database user name and password in the connection"


class MissingPrivilege(CdcError):
    """The user lacks a privilege the connector needs."""

    disposition = Disposition.NEEDS_OPERATOR
    default_hint = "grant the privilege named in the message to the connector's database user"


class ServerMisconfigured(CdcError):
    """A server setting prevents change capture (e.g. wal_level, binlog_format)."""

    disposition = Disposition.NEEDS_OPERATOR
    default_hint = "change the server setting named in the message and restart the server"


class SchemaError(CdcError):
    """A captured table cannot be processed as defined (no key, unsupported type, ...)."""

    disposition = Disposition.NEEDS_OPERATOR
    default_hint = "fix the table definition or the connector configuration named in the message"


class UnsupportedType(SchemaError):
    """A column has a data type the connector cannot represent."""

    default_hint = "exclude the column with column.exclude.list or set include.unknown.datatypes=true"


class OffsetUnavailable(CdcError):
    """The stored offset can no longer be read from the source (slot lost, log purged)."""

    disposition = Disposition.NEEDS_OPERATOR
    default_hint = (
        "changes since the stored offset may be lost; set snapshot.mode=when_needed to "
        "re-snapshot, or reset the connector state"
    )


class StateConflict(CdcError):
    """Compare-and-set on the state store failed: another run committed first."""

    disposition = Disposition.RETRYABLE
    default_hint = "another run of this connector committed first; the next run continues from its offset"


class ProtocolError(CdcError):
    """The source sent data the decoder cannot parse."""

    disposition = Disposition.FATAL
    default_hint = "this is a bug or an unsupported server version; report it with the message"


class BatchError(CdcError):
    """A staged batch is missing, incomplete or inconsistent."""

    disposition = Disposition.FATAL
    default_hint = "the staged batch is damaged; re-run capture from the committed offset"


class BatchNotApplied(CdcError):
    """Commit refused: the batch has not reached every Delta table it touches."""

    disposition = Disposition.NEEDS_OPERATOR
    default_hint = "run apply for the batch (idempotent), then commit it again"


class ApplyInterrupted(CdcError):
    """The apply job was killed before it finished (signal, out of memory, lost executor)."""

    disposition = Disposition.RETRYABLE
    default_hint = "re-run apply for the same batch: it is idempotent and continues where it stopped"


class ApplyFailed(CdcError):
    """The apply job ended with an unexpected error of its own (lost executor, storage blip, bug).

    Retryable: apply is idempotent and many Spark failures are transient."""

    disposition = Disposition.RETRYABLE
    default_hint = (
        "re-run apply for the same batch (idempotent); if it fails the same way, the spark-submit "
        "output above names the cause"
    )


class LeaseHeld(CdcError):
    """Another run of the connector holds its lease (capture, apply and commit never overlap)."""

    disposition = Disposition.RETRYABLE
    default_hint = "another run of this connector is working; retry when it has finished"


class LeaseLost(CdcError):
    """This run's lease expired and was taken over (fenced): it must not publish or commit."""

    disposition = Disposition.RETRYABLE
    default_hint = "a newer run of this connector took over; this run stops without writing anything more"


class StorageUnavailable(CdcError):
    """The object store holding staged batches or Delta tables could not be reached or refused a
    request (network, server down, throttling, credentials that expired)."""

    disposition = Disposition.RETRYABLE
    default_hint = (
        "check that the object store is reachable and the credentials are valid; nothing was "
        "published half, so the next run picks up from the last committed batch"
    )


class RetainedLogExceeded(CdcError):
    """The source keeps more log for the connector than its limit allows (``retained.log.max.*``):
    the server is about to drop the committed position or fill its disk."""

    disposition = Disposition.NEEDS_OPERATOR
    default_hint = (
        "get the pipeline committing again (apply and commit the staged batches, fix the failing "
        "task), or drop the connector's position on purpose (snapshot.mode=when_needed); raise "
        "retained.log.max.* only when the server has room"
    )
