"""Our own subset of Vitess's protos (package names, message names and field numbers of
vitessio/vitess ``proto/``, v18.0.0) and the Python modules grpcio-tools generates from them
(``scripts/gen_vitess_protos.sh``; do not edit the ``*_pb2*`` files by hand)."""
