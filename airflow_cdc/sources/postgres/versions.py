"""What each PostgreSQL major offers the connector (``server_version_num`` thresholds).

One place for the version differences the capture depends on, each from the server's release
notes / documentation:

- 13: the oldest supported server: ``pg_current_snapshot()`` (chunks' visibility) is new in 13.
- 14: pgoutput's ``messages`` option (logical decoding messages) and protocol version 2
  (``streaming``: in-progress transactions).  On 13 pgoutput refuses both ("unrecognized pgoutput
  option"), so windows there ask for protocol 1 without messages.
- 16: logical decoding on a standby; ``pg_replication_slots.conflicting``.
- 17: failover slots (``failover`` of ``pg_create_logical_replication_slot``, the column
  ``pg_replication_slots.failover``), ``invalidation_reason`` and ``inactive_since``.
"""

from __future__ import annotations

OLDEST = 130000
MESSAGES = 140000
STREAMING = 140000
STANDBY_DECODING = 160000
FAILOVER_SLOTS = 170000


def major(version_num: int) -> int:
    """The major version of a ``server_version_num`` (``170006`` -> 17)."""
    return version_num // 10000


def window_options(version_num: int, *, streaming: bool) -> list[tuple[str, str]]:
    """pgoutput's options for a change window on this server, in the order they are sent.

    :param version_num: the server's ``server_version_num``.
    :param streaming: ask for in-progress transactions (protocol 2; ignored below 14).
    """
    options = [("proto_version", "2" if streaming and version_num >= STREAMING else "1")]
    if streaming and version_num >= STREAMING:
        options.append(("streaming", "on"))
    return options


def with_messages(version_num: int) -> bool:
    """Whether pgoutput accepts ``messages 'true'`` (14+)."""
    return version_num >= MESSAGES
