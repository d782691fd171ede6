from airflow_cdc.sources.vitess.proto import binlogdata_pb2 as _binlogdata_pb2
from airflow_cdc.sources.vitess.proto import query_pb2 as _query_pb2
from airflow_cdc.sources.vitess.proto import topodata_pb2 as _topodata_pb2
from airflow_cdc.sources.vitess.proto import vtrpc_pb2 as _vtrpc_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class VStreamFlags(_message.Message):
    __slots__ = ("minimize_skew", "heartbeat_interval", "stop_on_reshard", "cells", "cell_preference", "tablet_order", "tables_to_copy")
    MINIMIZE_SKEW_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    STOP_ON_RESHARD_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    CELL_PREFERENCE_FIELD_NUMBER: _ClassVar[int]
    TABLET_ORDER_FIELD_NUMBER: _ClassVar[int]
    TABLES_TO_COPY_FIELD_NUMBER: _ClassVar[int]
    minimize_skew: bool
    heartbeat_interval: int
    stop_on_reshard: bool
    cells: str
    cell_preference: str
    tablet_order: str
    tables_to_copy: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, minimize_skew: _Optional[bool] = ..., heartbeat_interval: _Optional[int] = ..., stop_on_reshard: _Optional[bool] = ..., cells: _Optional[str] = ..., cell_preference: _Optional[str] = ..., tablet_order: _Optional[str] = ..., tables_to_copy: _Optional[_Iterable[str]] = ...) -> None: ...

class VStreamRequest(_message.Message):
    __slots__ = ("caller_id", "tablet_type", "vgtid", "filter", "flags")
    CALLER_ID_FIELD_NUMBER: _ClassVar[int]
    TABLET_TYPE_FIELD_NUMBER: _ClassVar[int]
    VGTID_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    caller_id: _vtrpc_pb2.CallerID
    tablet_type: _topodata_pb2.TabletType
    vgtid: _binlogdata_pb2.VGtid
    filter: _binlogdata_pb2.Filter
    flags: VStreamFlags
    def __init__(self, caller_id: _Optional[_Union[_vtrpc_pb2.CallerID, _Mapping]] = ..., tablet_type: _Optional[_Union[_topodata_pb2.TabletType, str]] = ..., vgtid: _Optional[_Union[_binlogdata_pb2.VGtid, _Mapping]] = ..., filter: _Optional[_Union[_binlogdata_pb2.Filter, _Mapping]] = ..., flags: _Optional[_Union[VStreamFlags, _Mapping]] = ...) -> None: ...

class VStreamResponse(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_binlogdata_pb2.VEvent]
    def __init__(self, events: _Optional[_Iterable[_Union[_binlogdata_pb2.VEvent, _Mapping]]] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("autocommit", "target_string", "options")
    AUTOCOMMIT_FIELD_NUMBER: _ClassVar[int]
    TARGET_STRING_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    autocommit: bool
    target_string: str
    options: _query_pb2.ExecuteOptions
    def __init__(self, autocommit: _Optional[bool] = ..., target_string: _Optional[str] = ..., options: _Optional[_Union[_query_pb2.ExecuteOptions, _Mapping]] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("caller_id", "session", "query")
    CALLER_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    caller_id: _vtrpc_pb2.CallerID
    session: Session
    query: _query_pb2.BoundQuery
    def __init__(self, caller_id: _Optional[_Union[_vtrpc_pb2.CallerID, _Mapping]] = ..., session: _Optional[_Union[Session, _Mapping]] = ..., query: _Optional[_Union[_query_pb2.BoundQuery, _Mapping]] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("error", "session", "result")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    error: _vtrpc_pb2.RPCError
    session: Session
    result: _query_pb2.QueryResult
    def __init__(self, error: _Optional[_Union[_vtrpc_pb2.RPCError, _Mapping]] = ..., session: _Optional[_Union[Session, _Mapping]] = ..., result: _Optional[_Union[_query_pb2.QueryResult, _Mapping]] = ...) -> None: ...
