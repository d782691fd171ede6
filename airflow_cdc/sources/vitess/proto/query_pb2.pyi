from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MySqlFlag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EMPTY: _ClassVar[MySqlFlag]
    NOT_NULL_FLAG: _ClassVar[MySqlFlag]
    PRI_KEY_FLAG: _ClassVar[MySqlFlag]
    UNIQUE_KEY_FLAG: _ClassVar[MySqlFlag]
    MULTIPLE_KEY_FLAG: _ClassVar[MySqlFlag]
    BLOB_FLAG: _ClassVar[MySqlFlag]
    UNSIGNED_FLAG: _ClassVar[MySqlFlag]
    ZEROFILL_FLAG: _ClassVar[MySqlFlag]
    BINARY_FLAG: _ClassVar[MySqlFlag]
    ENUM_FLAG: _ClassVar[MySqlFlag]
    AUTO_INCREMENT_FLAG: _ClassVar[MySqlFlag]
    TIMESTAMP_FLAG: _ClassVar[MySqlFlag]
    SET_FLAG: _ClassVar[MySqlFlag]
    NO_DEFAULT_VALUE_FLAG: _ClassVar[MySqlFlag]
    ON_UPDATE_NOW_FLAG: _ClassVar[MySqlFlag]
    NUM_FLAG: _ClassVar[MySqlFlag]
    PART_KEY_FLAG: _ClassVar[MySqlFlag]
    GROUP_FLAG: _ClassVar[MySqlFlag]
    UNIQUE_FLAG: _ClassVar[MySqlFlag]
    BINCMP_FLAG: _ClassVar[MySqlFlag]

class Flag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[Flag]
    ISINTEGRAL: _ClassVar[Flag]
    ISUNSIGNED: _ClassVar[Flag]
    ISFLOAT: _ClassVar[Flag]
    ISQUOTED: _ClassVar[Flag]
    ISTEXT: _ClassVar[Flag]
    ISBINARY: _ClassVar[Flag]

class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NULL_TYPE: _ClassVar[Type]
    INT8: _ClassVar[Type]
    UINT8: _ClassVar[Type]
    INT16: _ClassVar[Type]
    UINT16: _ClassVar[Type]
    INT24: _ClassVar[Type]
    UINT24: _ClassVar[Type]
    INT32: _ClassVar[Type]
    UINT32: _ClassVar[Type]
    INT64: _ClassVar[Type]
    UINT64: _ClassVar[Type]
    FLOAT32: _ClassVar[Type]
    FLOAT64: _ClassVar[Type]
    TIMESTAMP: _ClassVar[Type]
    DATE: _ClassVar[Type]
    TIME: _ClassVar[Type]
    DATETIME: _ClassVar[Type]
    YEAR: _ClassVar[Type]
    DECIMAL: _ClassVar[Type]
    TEXT: _ClassVar[Type]
    BLOB: _ClassVar[Type]
    VARCHAR: _ClassVar[Type]
    VARBINARY: _ClassVar[Type]
    CHAR: _ClassVar[Type]
    BINARY: _ClassVar[Type]
    BIT: _ClassVar[Type]
    ENUM: _ClassVar[Type]
    SET: _ClassVar[Type]
    TUPLE: _ClassVar[Type]
    GEOMETRY: _ClassVar[Type]
    JSON: _ClassVar[Type]
    EXPRESSION: _ClassVar[Type]
    HEXNUM: _ClassVar[Type]
    HEXVAL: _ClassVar[Type]
    BITNUM: _ClassVar[Type]
EMPTY: MySqlFlag
NOT_NULL_FLAG: MySqlFlag
PRI_KEY_FLAG: MySqlFlag
UNIQUE_KEY_FLAG: MySqlFlag
MULTIPLE_KEY_FLAG: MySqlFlag
BLOB_FLAG: MySqlFlag
UNSIGNED_FLAG: MySqlFlag
ZEROFILL_FLAG: MySqlFlag
BINARY_FLAG: MySqlFlag
ENUM_FLAG: MySqlFlag
AUTO_INCREMENT_FLAG: MySqlFlag
TIMESTAMP_FLAG: MySqlFlag
SET_FLAG: MySqlFlag
NO_DEFAULT_VALUE_FLAG: MySqlFlag
ON_UPDATE_NOW_FLAG: MySqlFlag
NUM_FLAG: MySqlFlag
PART_KEY_FLAG: MySqlFlag
GROUP_FLAG: MySqlFlag
UNIQUE_FLAG: MySqlFlag
BINCMP_FLAG: MySqlFlag
NONE: Flag
ISINTEGRAL: Flag
ISUNSIGNED: Flag
ISFLOAT: Flag
ISQUOTED: Flag
ISTEXT: Flag
ISBINARY: Flag
NULL_TYPE: Type
INT8: Type
UINT8: Type
INT16: Type
UINT16: Type
INT24: Type
UINT24: Type
INT32: Type
UINT32: Type
INT64: Type
UINT64: Type
FLOAT32: Type
FLOAT64: Type
TIMESTAMP: Type
DATE: Type
TIME: Type
DATETIME: Type
YEAR: Type
DECIMAL: Type
TEXT: Type
BLOB: Type
VARCHAR: Type
VARBINARY: Type
CHAR: Type
BINARY: Type
BIT: Type
ENUM: Type
SET: Type
TUPLE: Type
GEOMETRY: Type
JSON: Type
EXPRESSION: Type
HEXNUM: Type
HEXVAL: Type
BITNUM: Type

class Field(_message.Message):
    __slots__ = ("name", "type", "table", "org_table", "database", "org_name", "column_length", "charset", "decimals", "flags", "column_type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    ORG_TABLE_FIELD_NUMBER: _ClassVar[int]
    DATABASE_FIELD_NUMBER: _ClassVar[int]
    ORG_NAME_FIELD_NUMBER: _ClassVar[int]
    COLUMN_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHARSET_FIELD_NUMBER: _ClassVar[int]
    DECIMALS_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    COLUMN_TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: Type
    table: str
    org_table: str
    database: str
    org_name: str
    column_length: int
    charset: int
    decimals: int
    flags: int
    column_type: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[_Union[Type, str]] = ..., table: _Optional[str] = ..., org_table: _Optional[str] = ..., database: _Optional[str] = ..., org_name: _Optional[str] = ..., column_length: _Optional[int] = ..., charset: _Optional[int] = ..., decimals: _Optional[int] = ..., flags: _Optional[int] = ..., column_type: _Optional[str] = ...) -> None: ...

class Row(_message.Message):
    __slots__ = ("lengths", "values")
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    lengths: _containers.RepeatedScalarFieldContainer[int]
    values: bytes
    def __init__(self, lengths: _Optional[_Iterable[int]] = ..., values: _Optional[bytes] = ...) -> None: ...

class QueryResult(_message.Message):
    __slots__ = ("fields", "rows_affected", "insert_id", "rows", "info", "session_state_changes")
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    ROWS_AFFECTED_FIELD_NUMBER: _ClassVar[int]
    INSERT_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    SESSION_STATE_CHANGES_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.RepeatedCompositeFieldContainer[Field]
    rows_affected: int
    insert_id: int
    rows: _containers.RepeatedCompositeFieldContainer[Row]
    info: str
    session_state_changes: str
    def __init__(self, fields: _Optional[_Iterable[_Union[Field, _Mapping]]] = ..., rows_affected: _Optional[int] = ..., insert_id: _Optional[int] = ..., rows: _Optional[_Iterable[_Union[Row, _Mapping]]] = ..., info: _Optional[str] = ..., session_state_changes: _Optional[str] = ...) -> None: ...

class BindVariable(_message.Message):
    __slots__ = ("type", "value")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    type: Type
    value: bytes
    def __init__(self, type: _Optional[_Union[Type, str]] = ..., value: _Optional[bytes] = ...) -> None: ...

class BoundQuery(_message.Message):
    __slots__ = ("sql", "bind_variables")
    class BindVariablesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: BindVariable
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[BindVariable, _Mapping]] = ...) -> None: ...
    SQL_FIELD_NUMBER: _ClassVar[int]
    BIND_VARIABLES_FIELD_NUMBER: _ClassVar[int]
    sql: str
    bind_variables: _containers.MessageMap[str, BindVariable]
    def __init__(self, sql: _Optional[str] = ..., bind_variables: _Optional[_Mapping[str, BindVariable]] = ...) -> None: ...

class ExecuteOptions(_message.Message):
    __slots__ = ("included_fields",)
    class IncludedFields(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TYPE_AND_NAME: _ClassVar[ExecuteOptions.IncludedFields]
        TYPE_ONLY: _ClassVar[ExecuteOptions.IncludedFields]
        ALL: _ClassVar[ExecuteOptions.IncludedFields]
    TYPE_AND_NAME: ExecuteOptions.IncludedFields
    TYPE_ONLY: ExecuteOptions.IncludedFields
    ALL: ExecuteOptions.IncludedFields
    INCLUDED_FIELDS_FIELD_NUMBER: _ClassVar[int]
    included_fields: ExecuteOptions.IncludedFields
    def __init__(self, included_fields: _Optional[_Union[ExecuteOptions.IncludedFields, str]] = ...) -> None: ...
