#!/usr/bin/env bash
# Regenerate the protobuf modules (`make proto`). protoc comes from grpcio-tools, installed in a
# separate tools venv so its protobuf pin can never change the project's runtime protobuf. The
# generated files are committed: nothing at run time or in CI needs protoc.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=.local/protogen
if [ ! -x "$TOOLS/bin/python" ]; then
    python3 -m venv "$TOOLS"
    "$TOOLS/bin/pip" install -q grpcio-tools
fi
"$TOOLS/bin/python" -m grpc_tools.protoc -Iproto --python_out=app/api --pyi_out=app/api proto/cursor.proto
echo "generated app/api/cursor_pb2.py and app/api/cursor_pb2.pyi with $("$TOOLS/bin/python" -m grpc_tools.protoc --version)"
