"""A VStream EMULATOR for tests: a stand-in for Vitess's vtgate, not Vitess.

No vtgate can run on these machines (Vitess needs MySQL 8 / Percona; Debian ships MariaDB).  The
emulator serves vtgate's gRPC ``vtgateservice.Vitess/VStream`` on loopback with the wire format of
our proto subset (:mod:`airflow_cdc.sources.vitess.proto`), backed by real MariaDB servers as
shards: their binlogs (read with the MySQL source's binlog reader) become BEGIN / FIELD / ROW /
VGTID / COMMIT / DDL / OTHER events, ``gtid: ""`` or ``table_p_ks`` run a copy phase, a keyspace
can be resharded mid-stream, and bad requests get vtgate's gRPC status codes and messages.

Known differences from vtgate: one tablet per shard (every tablet type reads the primary);
filters are table names / ``/regexp`` with ``select * from t`` or nothing (no key-range or
column filters); ``minimize_skew`` and cells are ignored; FIELD events come from the current
schema (no schema historian); positions map MariaDB's ``0-<server_id>-<n>`` onto
``MySQL56/<uuid>:1-<n>`` (:mod:`.shard`); ``RowChange.data_columns`` is never set (full row
images); the resharding journal lives in ``_vt.resharding_journal`` of the emulator's own layout.
"""

from airflow_cdc.testing.vitess_emulator.server import VtgateEmulator, start_shard_server
from airflow_cdc.testing.vitess_emulator.shard import EmulatedShard

__all__ = ["EmulatedShard", "VtgateEmulator", "start_shard_server"]
