from airflow_cdc.sources.vitess.proto import query_pb2 as _query_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VEventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN: _ClassVar[VEventType]
    GTID: _ClassVar[VEventType]
    BEGIN: _ClassVar[VEventType]
    COMMIT: _ClassVar[VEventType]
    ROLLBACK: _ClassVar[VEventType]
    DDL: _ClassVar[VEventType]
    INSERT: _ClassVar[VEventType]
    REPLACE: _ClassVar[VEventType]
    UPDATE: _ClassVar[VEventType]
    DELETE: _ClassVar[VEventType]
    SET: _ClassVar[VEventType]
    OTHER: _ClassVar[VEventType]
    ROW: _ClassVar[VEventType]
    FIELD: _ClassVar[VEventType]
    HEARTBEAT: _ClassVar[VEventType]
    VGTID: _ClassVar[VEventType]
    JOURNAL: _ClassVar[VEventType]
    VERSION: _ClassVar[VEventType]
    LASTPK: _ClassVar[VEventType]
    SAVEPOINT: _ClassVar[VEventType]
    COPY_COMPLETED: _ClassVar[VEventType]

class MigrationType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TABLES: _ClassVar[MigrationType]
    SHARDS: _ClassVar[MigrationType]
UNKNOWN: VEventType
GTID: VEventType
BEGIN: VEventType
COMMIT: VEventType
ROLLBACK: VEventType
DDL: VEventType
INSERT: VEventType
REPLACE: VEventType
UPDATE: VEventType
DELETE: VEventType
SET: VEventType
OTHER: VEventType
ROW: VEventType
FIELD: VEventType
HEARTBEAT: VEventType
VGTID: VEventType
JOURNAL: VEventType
VERSION: VEventType
LASTPK: VEventType
SAVEPOINT: VEventType
COPY_COMPLETED: VEventType
TABLES: MigrationType
SHARDS: MigrationType

class Rule(_message.Message):
    __slots__ = ("match", "filter")
    MATCH_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    match: str
    filter: str
    def __init__(self, match: _Optional[str] = ..., filter: _Optional[str] = ...) -> None: ...

class Filter(_message.Message):
    __slots__ = ("rules", "field_event_mode", "workflow_type", "workflow_name")
    class FieldEventMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        ERR_ON_MISMATCH: _ClassVar[Filter.FieldEventMode]
        BEST_EFFORT: _ClassVar[Filter.FieldEventMode]
    ERR_ON_MISMATCH: Filter.FieldEventMode
    BEST_EFFORT: Filter.FieldEventMode
    RULES_FIELD_NUMBER: _ClassVar[int]
    FIELD_EVENT_MODE_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_TYPE_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    rules: _containers.RepeatedCompositeFieldContainer[Rule]
    field_event_mode: Filter.FieldEventMode
    workflow_type: int
    workflow_name: str
    def __init__(self, rules: _Optional[_Iterable[_Union[Rule, _Mapping]]] = ..., field_event_mode: _Optional[_Union[Filter.FieldEventMode, str]] = ..., workflow_type: _Optional[int] = ..., workflow_name: _Optional[str] = ...) -> None: ...

class RowChange(_message.Message):
    __slots__ = ("before", "after", "data_columns", "json_partial_values")
    class Bitmap(_message.Message):
        __slots__ = ("count", "cols")
        COUNT_FIELD_NUMBER: _ClassVar[int]
        COLS_FIELD_NUMBER: _ClassVar[int]
        count: int
        cols: bytes
        def __init__(self, count: _Optional[int] = ..., cols: _Optional[bytes] = ...) -> None: ...
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    DATA_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    JSON_PARTIAL_VALUES_FIELD_NUMBER: _ClassVar[int]
    before: _query_pb2.Row
    after: _query_pb2.Row
    data_columns: RowChange.Bitmap
    json_partial_values: RowChange.Bitmap
    def __init__(self, before: _Optional[_Union[_query_pb2.Row, _Mapping]] = ..., after: _Optional[_Union[_query_pb2.Row, _Mapping]] = ..., data_columns: _Optional[_Union[RowChange.Bitmap, _Mapping]] = ..., json_partial_values: _Optional[_Union[RowChange.Bitmap, _Mapping]] = ...) -> None: ...

class RowEvent(_message.Message):
    __slots__ = ("table_name", "row_changes", "keyspace", "shard", "flags")
    TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    ROW_CHANGES_FIELD_NUMBER: _ClassVar[int]
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    table_name: str
    row_changes: _containers.RepeatedCompositeFieldContainer[RowChange]
    keyspace: str
    shard: str
    flags: int
    def __init__(self, table_name: _Optional[str] = ..., row_changes: _Optional[_Iterable[_Union[RowChange, _Mapping]]] = ..., keyspace: _Optional[str] = ..., shard: _Optional[str] = ..., flags: _Optional[int] = ...) -> None: ...

class FieldEvent(_message.Message):
    __slots__ = ("table_name", "fields", "keyspace", "shard", "enum_set_string_values")
    TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    ENUM_SET_STRING_VALUES_FIELD_NUMBER: _ClassVar[int]
    table_name: str
    fields: _containers.RepeatedCompositeFieldContainer[_query_pb2.Field]
    keyspace: str
    shard: str
    enum_set_string_values: bool
    def __init__(self, table_name: _Optional[str] = ..., fields: _Optional[_Iterable[_Union[_query_pb2.Field, _Mapping]]] = ..., keyspace: _Optional[str] = ..., shard: _Optional[str] = ..., enum_set_string_values: _Optional[bool] = ...) -> None: ...

class ShardGtid(_message.Message):
    __slots__ = ("keyspace", "shard", "gtid", "table_p_ks")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    GTID_FIELD_NUMBER: _ClassVar[int]
    TABLE_P_KS_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    shard: str
    gtid: str
    table_p_ks: _containers.RepeatedCompositeFieldContainer[TableLastPK]
    def __init__(self, keyspace: _Optional[str] = ..., shard: _Optional[str] = ..., gtid: _Optional[str] = ..., table_p_ks: _Optional[_Iterable[_Union[TableLastPK, _Mapping]]] = ...) -> None: ...

class VGtid(_message.Message):
    __slots__ = ("shard_gtids",)
    SHARD_GTIDS_FIELD_NUMBER: _ClassVar[int]
    shard_gtids: _containers.RepeatedCompositeFieldContainer[ShardGtid]
    def __init__(self, shard_gtids: _Optional[_Iterable[_Union[ShardGtid, _Mapping]]] = ...) -> None: ...

class KeyspaceShard(_message.Message):
    __slots__ = ("keyspace", "shard")
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    keyspace: str
    shard: str
    def __init__(self, keyspace: _Optional[str] = ..., shard: _Optional[str] = ...) -> None: ...

class Journal(_message.Message):
    __slots__ = ("id", "migration_type", "tables", "local_position", "shard_gtids", "participants", "source_workflows")
    ID_FIELD_NUMBER: _ClassVar[int]
    MIGRATION_TYPE_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    SHARD_GTIDS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_WORKFLOWS_FIELD_NUMBER: _ClassVar[int]
    id: int
    migration_type: MigrationType
    tables: _containers.RepeatedScalarFieldContainer[str]
    local_position: str
    shard_gtids: _containers.RepeatedCompositeFieldContainer[ShardGtid]
    participants: _containers.RepeatedCompositeFieldContainer[KeyspaceShard]
    source_workflows: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[int] = ..., migration_type: _Optional[_Union[MigrationType, str]] = ..., tables: _Optional[_Iterable[str]] = ..., local_position: _Optional[str] = ..., shard_gtids: _Optional[_Iterable[_Union[ShardGtid, _Mapping]]] = ..., participants: _Optional[_Iterable[_Union[KeyspaceShard, _Mapping]]] = ..., source_workflows: _Optional[_Iterable[str]] = ...) -> None: ...

class VEvent(_message.Message):
    __slots__ = ("type", "timestamp", "gtid", "statement", "row_event", "field_event", "vgtid", "journal", "dml", "current_time", "last_p_k_event", "keyspace", "shard", "throttled")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    GTID_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    ROW_EVENT_FIELD_NUMBER: _ClassVar[int]
    FIELD_EVENT_FIELD_NUMBER: _ClassVar[int]
    VGTID_FIELD_NUMBER: _ClassVar[int]
    JOURNAL_FIELD_NUMBER: _ClassVar[int]
    DML_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_P_K_EVENT_FIELD_NUMBER: _ClassVar[int]
    KEYSPACE_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    type: VEventType
    timestamp: int
    gtid: str
    statement: str
    row_event: RowEvent
    field_event: FieldEvent
    vgtid: VGtid
    journal: Journal
    dml: str
    current_time: int
    last_p_k_event: LastPKEvent
    keyspace: str
    shard: str
    throttled: bool
    def __init__(self, type: _Optional[_Union[VEventType, str]] = ..., timestamp: _Optional[int] = ..., gtid: _Optional[str] = ..., statement: _Optional[str] = ..., row_event: _Optional[_Union[RowEvent, _Mapping]] = ..., field_event: _Optional[_Union[FieldEvent, _Mapping]] = ..., vgtid: _Optional[_Union[VGtid, _Mapping]] = ..., journal: _Optional[_Union[Journal, _Mapping]] = ..., dml: _Optional[str] = ..., current_time: _Optional[int] = ..., last_p_k_event: _Optional[_Union[LastPKEvent, _Mapping]] = ..., keyspace: _Optional[str] = ..., shard: _Optional[str] = ..., throttled: _Optional[bool] = ...) -> None: ...

class MinimalTable(_message.Message):
    __slots__ = ("name", "fields", "p_k_columns")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    P_K_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    name: str
    fields: _containers.RepeatedCompositeFieldContainer[_query_pb2.Field]
    p_k_columns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, name: _Optional[str] = ..., fields: _Optional[_Iterable[_Union[_query_pb2.Field, _Mapping]]] = ..., p_k_columns: _Optional[_Iterable[int]] = ...) -> None: ...

class LastPKEvent(_message.Message):
    __slots__ = ("table_last_p_k", "completed")
    TABLE_LAST_P_K_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    table_last_p_k: TableLastPK
    completed: bool
    def __init__(self, table_last_p_k: _Optional[_Union[TableLastPK, _Mapping]] = ..., completed: _Optional[bool] = ...) -> None: ...

class TableLastPK(_message.Message):
    __slots__ = ("table_name", "lastpk")
    TABLE_NAME_FIELD_NUMBER: _ClassVar[int]
    LASTPK_FIELD_NUMBER: _ClassVar[int]
    table_name: str
    lastpk: _query_pb2.QueryResult
    def __init__(self, table_name: _Optional[str] = ..., lastpk: _Optional[_Union[_query_pb2.QueryResult, _Mapping]] = ...) -> None: ...
