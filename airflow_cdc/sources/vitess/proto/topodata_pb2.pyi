from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor

class TabletType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN: _ClassVar[TabletType]
    PRIMARY: _ClassVar[TabletType]
    MASTER: _ClassVar[TabletType]
    REPLICA: _ClassVar[TabletType]
    RDONLY: _ClassVar[TabletType]
    BATCH: _ClassVar[TabletType]
    SPARE: _ClassVar[TabletType]
    EXPERIMENTAL: _ClassVar[TabletType]
    BACKUP: _ClassVar[TabletType]
    RESTORE: _ClassVar[TabletType]
    DRAINED: _ClassVar[TabletType]
UNKNOWN: TabletType
PRIMARY: TabletType
MASTER: TabletType
REPLICA: TabletType
RDONLY: TabletType
BATCH: TabletType
SPARE: TabletType
EXPERIMENTAL: TabletType
BACKUP: TabletType
RESTORE: TabletType
DRAINED: TabletType
