#!/usr/bin/env bash
# The local Redis Cluster (3 masters + 3 replicas on 127.0.0.1:7101-7106) the cluster tests use:
# started, repaired or reused by scripts/redis_cluster.sh (about 3 s from nothing, 0.1 s reused).
set -euo pipefail
exec bash "$ROOT/scripts/redis_cluster.sh" up
