from airflow_cdc.sources.vitess.proto import vtgate_pb2 as _vtgate_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
