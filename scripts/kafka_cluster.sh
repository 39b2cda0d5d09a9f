#!/usr/bin/env bash
# A local 3-node Kafka KRaft cluster for the chaos tests (issue 18): replication factor 3,
# min.insync.replicas=2, from the same jars as the single broker (scripts/kafka/pom.xml, resolved
# into .local/kafka/lib). NOT started by `make test`: `make kafka-cluster-up`, or the chaos tests
# themselves (`make chaos-infra-check`).
#
#   scripts/kafka_cluster.sh up      start the nodes that are not running, wait until all 3 serve
#   scripts/kafka_cluster.sh down    stop this checkout's nodes (data kept: delete
#                                    .local/kafka-cluster to start from empty)
#   scripts/kafka_cluster.sh status  one line per node
#
# Ports: node N (1..3) serves clients on 127.0.0.1:919N and its controller on 127.0.0.1:1919N.
# Everything a node writes lives in .local/kafka-cluster/node-N/ (server.properties, data/,
# kafka.log, kafka.pid). A cluster that already serves on those ports is reused, whichever
# checkout started it. Waits: KAFKA_CLUSTER_TIMEOUT (s, 180). Heap per node: 512 MB.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="$ROOT/.local/kafka-cluster"
LIB="$ROOT/.local/kafka/lib"
PY="$ROOT/.venv/bin/python"
HOST=127.0.0.1
NODES=(1 2 3)
TIMEOUT="${KAFKA_CLUSTER_TIMEOUT:-180}"

log() { printf '[kafka-cluster] %s\n' "$*"; }
fail() { printf '[kafka-cluster] ERROR: %s\n' "$*" >&2; }

port() { echo $((9190 + $1)); }
controller_port() { echo $((19190 + $1)); }
dir() { echo "$LOCAL/node-$1"; }
pidfile() { echo "$(dir "$1")/kafka.pid"; }
logfile() { echo "$(dir "$1")/kafka.log"; }
bootstrap() { local n out=(); for n in "${NODES[@]}"; do out+=("$HOST:$(port "$n")"); done; (IFS=,; echo "${out[*]}"); }

pid_alive() {
    local pid="$1" state
    kill -0 "$pid" 2>/dev/null || return 1
    state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo Z)"
    [[ "$state" != "Z" ]]
}

our_pid() {
    local n="$1" f pid
    f="$(pidfile "$n")"
    [[ -f "$f" ]] || return 1
    pid="$(tr -dc '0-9' <"$f")"
    [[ -n "$pid" ]] && pid_alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-Dprojector.service=kafka-cluster-$n " || return 1
    echo "$pid"
}

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null; }
port_owner() { python3 "$ROOT/scripts/portowner.py" "$1" 2>/dev/null || echo "an unknown process"; }

# Empty output = every node serves metadata naming all 3 brokers; else why not.
why_unhealthy() {
    local n
    for n in "${NODES[@]}"; do
        port_open "$(port "$n")" || { echo "node $n (port $(port "$n")) is not listening"; return; }
    done
    [[ -x "$PY" ]] || return 0 # before `make setup` only the TCP probe is possible
    "$PY" - "$(bootstrap)" <<'PYEOF'
import asyncio, logging, sys
from aiokafka.admin import AIOKafkaAdminClient

logging.disable(logging.CRITICAL)


async def main(addresses: list[str]) -> str:
    for address in addresses:  # each node must know the whole cluster
        admin = AIOKafkaAdminClient(bootstrap_servers=address, request_timeout_ms=5000)
        try:
            await asyncio.wait_for(admin.start(), 8)
            found = await asyncio.wait_for(admin.describe_cluster(), 8)
            if len(found.get("brokers", [])) != 3 or found.get("controller_id", -1) < 0:
                return f"{address} sees {len(found.get('brokers', []))} brokers, controller {found.get('controller_id')}"
        except Exception as exc:  # any failure is "not healthy", with its reason
            return f"{address}: {type(exc).__name__}: {exc}"
        finally:
            await admin.close()
    return ""


print(asyncio.run(main(sys.argv[1].split(","))), end="")
PYEOF
}

healthy() { [[ -z "$(why_unhealthy 2>/dev/null)" ]]; }

wait_healthy() {
    local deadline=$((SECONDS + $1)) n pid
    while ((SECONDS < deadline)); do
        healthy && return 0
        for n in "${NODES[@]}"; do
            if [[ -f "$(pidfile "$n")" ]] && ! our_pid "$n" >/dev/null; then
                tail -n 30 "$(logfile "$n")" >&2 || true
                fail "node $n exited while starting (log: $(logfile "$n"))"
                return 1
            fi
        done
        sleep 1
    done
    return 1
}

set_jvm() { # N: the java command line prefix of node N, into the array JVM
    local d
    d="$(dir "$1")"
    JVM=(java "-Dprojector.service=kafka-cluster-$1" -Xms256m -Xmx512m -XX:+UseG1GC -XX:MaxGCPauseMillis=20
        -Djava.awt.headless=true "-Dlog4j.configuration=file:$d/log4j.properties" "-Dkafka.logs.dir=$d/logs"
        -cp "$LIB/*")
}

start_node() {
    local n="$1" d cluster_id
    d="$(dir "$n")"
    set_jvm "$n"
    mkdir -p "$d/data" "$d/logs"
    sed -e "s#@NODE@#$n#g" -e "s#@PORT@#$(port "$n")#g" -e "s#@CONTROLLER_PORT@#$(controller_port "$n")#g" \
        -e "s#@DATA@#$d/data#g" "$ROOT/scripts/kafka/cluster.properties" >"$d/server.properties"
    cp "$ROOT/scripts/kafka/log4j.properties" "$d/log4j.properties"
    [[ -f "$(logfile "$n")" ]] && mv -f "$(logfile "$n")" "$(logfile "$n").1"
    if [[ ! -f "$d/data/meta.properties" ]]; then
        # All nodes share one cluster id, kept beside them (22 chars of base64url, no leading '-').
        if [[ ! -f "$LOCAL/cluster.id" ]]; then
            python3 -c 'import base64,uuid
while True:
    s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not s.startswith("-"):
        print(s); break' >"$LOCAL/cluster.id"
        fi
        cluster_id="$(cat "$LOCAL/cluster.id")"
        if ! "${JVM[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$d/server.properties" \
            --ignore-formatted >>"$(logfile "$n")" 2>&1; then
            tail -n 20 "$(logfile "$n")" >&2
            fail "formatting node $n's storage failed"
            return 1
        fi
    fi
    python3 "$ROOT/scripts/daemon.py" "$(pidfile "$n")" "$(logfile "$n")" -- \
        "${JVM[@]}" kafka.Kafka "$d/server.properties" >/dev/null
}

cmd_up() {
    local t0=$SECONDS n started=0
    mkdir -p "$LOCAL"
    if healthy; then
        log "already serving on $(bootstrap): reused"
        return 0
    fi
    bash "$ROOT/scripts/services.sh" jars kafka
    for n in "${NODES[@]}"; do
        our_pid "$n" >/dev/null && continue
        rm -f "$(pidfile "$n")"
        local p
        for p in "$(port "$n")" "$(controller_port "$n")"; do
            if port_open "$p"; then
                fail "port $p is taken by $(port_owner "$p"), which is not node $n of a healthy local cluster."
                return 1
            fi
        done
        start_node "$n"
        started=$((started + 1))
    done
    log "started $started node(s); waiting up to ${TIMEOUT}s until all 3 serve"
    if ! wait_healthy "$TIMEOUT"; then
        fail "not healthy after $((SECONDS - t0))s: $(why_unhealthy 2>&1) (logs: $LOCAL/node-*/kafka.log)"
        return 1
    fi
    log "up on $(bootstrap) (3 brokers+controllers, RF 3, min.insync.replicas 2) in $((SECONDS - t0))s"
}

cmd_down() {
    # SIGTERM to all nodes at once: one at a time, the last ones would wait in vain for a
    # controller quorum that left with the first (a minute each before the SIGKILL).
    local n pid waited=0 pids=()
    for n in "${NODES[@]}"; do
        if pid="$(our_pid "$n")"; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$n:$pid")
        elif port_open "$(port "$n")"; then
            log "node $n not started by this checkout; left running: $(port_owner "$(port "$n")")"
        fi
    done
    for entry in "${pids[@]}"; do
        n="${entry%%:*}" pid="${entry#*:}"
        while pid_alive "$pid"; do
            if ((waited >= 60)); then
                log "node $n ignored SIGTERM for 60s: SIGKILL"
                kill -KILL "$pid" 2>/dev/null || true
                sleep 1
                break
            fi
            sleep 1
            waited=$((waited + 1))
        done
        rm -f "$(pidfile "$n")"
        log "node $n stopped"
    done
}

cmd_status() {
    local n pid reason
    reason="$(why_unhealthy 2>&1)"
    if [[ -z "$reason" ]]; then log "healthy on $(bootstrap)"; else log "NOT healthy: $reason"; fi
    for n in "${NODES[@]}"; do
        pid="$(our_pid "$n" || true)"
        if port_open "$(port "$n")"; then
            printf '[kafka-cluster]   node %s on %s:%s%s\n' "$n" "$HOST" "$(port "$n")" "${pid:+ (pid $pid, this checkout)}"
        else
            printf '[kafka-cluster]   node %s down\n' "$n"
        fi
    done
    [[ -z "$reason" ]]
}

lock() {
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>"${TMPDIR:-/tmp}/session-projector-kafka-cluster.lock"
    flock -w 600 9 || { fail "gave up waiting for another kafka_cluster.sh"; exit 1; }
}

case "${1:-}" in
    up) lock; cmd_up ;;
    down) lock; cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
