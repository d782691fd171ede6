#!/usr/bin/env bash
# Regenerate the Python modules of our Vitess proto subset (airflow_cdc/sources/vitess/proto/*.proto)
# with grpcio-tools, in place.  tests/unit/vitess/test_protos.py fails when the checked-in modules
# differ from what this script produces.
#
#   scripts/gen_vitess_protos.sh [OUTPUT_DIR]   (default: the repository root, i.e. in place)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root}"
py="${PYTHON:-$root/.venv/bin/python}"
cd "$root"
mkdir -p "$out/airflow_cdc/sources/vitess/proto"
# The protos import each other by repository path, so the generated modules import each other as
# airflow_cdc.sources.vitess.proto.<name>_pb2 (no sys.path tricks) and their descriptor file names
# cannot collide with another library's "query.proto".
"$py" -m grpc_tools.protoc -I . \
    --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
    airflow_cdc/sources/vitess/proto/*.proto
# Only the service module has stubs; grpc_python_out writes an empty *_pb2_grpc.py for the others.
for f in "$out"/airflow_cdc/sources/vitess/proto/*_pb2_grpc.py; do
    case "$f" in *vtgateservice_pb2_grpc.py) ;; *) rm -f "$f" ;; esac
done
