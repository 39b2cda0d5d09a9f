#!/usr/bin/env bash
# A local Redis Cluster on 127.0.0.1 for the cluster tests: 3 masters + 3 replicas of Debian's
# redis-server, nothing persisted.
#
#   scripts/redis_cluster.sh up      start what is missing, create the cluster, wait for health
#   scripts/redis_cluster.sh down    stop the nodes this checkout started and forget the cluster
#   scripts/redis_cluster.sh status  health, then one line per node (role, slots)
#   scripts/redis_cluster.sh start-node PORT DIR   (tests: start a killed node again)
#
# Ports: nodes 7101-7106 (cluster bus +10000: 17101-17106), below the ephemeral port range.
# Everything a node writes lives under .local/redis-cluster/<port>/ (nodes.conf, the replicas'
# sync file) with its log and pid file next to it. `make test` runs `up` (scripts/tools.d/).
#
# Health means: the 6 nodes answer PING, each says cluster_state:ok, every replica's link to its
# master is up (synced), node 7101 sees 6 connected
# nodes with no fail/handshake flag, 3 masters owning all 16384 slots, each with a replica, and no
# slot left half-migrated. A healthy cluster is reused whichever checkout started it (as
# services.sh reuses servers). A broken one is repaired first: missing nodes of this checkout are
# started again from their nodes.conf and rejoin (a killed master comes back as its successor's
# replica); if that does not bring health, the cluster is recreated from empty nodes (nothing is
# persisted, so nothing is lost that was not lost already). Waits: REDIS_CLUSTER_TIMEOUT (s, 60).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="$ROOT/.local/redis-cluster"
HOST=127.0.0.1
PORTS=(7101 7102 7103 7104 7105 7106)
NODE_TIMEOUT_MS=3000
TIMEOUT="${REDIS_CLUSTER_TIMEOUT:-60}"

log() { printf '[redis-cluster] %s\n' "$*"; }
fail() { printf '[redis-cluster] ERROR: %s\n' "$*" >&2; }

pidfile() { echo "$LOCAL/redis-$1.pid"; }
logfile() { echo "$LOCAL/redis-$1.log"; }
cli() { timeout 5 redis-cli -h "$HOST" -p "$1" "${@:2}" 2>/dev/null; }

pid_alive() {
    local pid="$1" state
    kill -0 "$pid" 2>/dev/null || return 1
    state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo Z)"
    [[ "$state" != "Z" ]]
}

# The pid of this checkout's node on PORT, if it is alive and is that redis-server.
our_pid() {
    local port="$1" f pid
    f="$(pidfile "$port")"
    [[ -f "$f" ]] || return 1
    pid="$(tr -dc '0-9' <"$f")"
    [[ -n "$pid" ]] && pid_alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "redis-server $HOST:$port" || return 1
    echo "$pid"
}

port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null; }

port_owner() {
    python3 "$ROOT/scripts/portowner.py" "$1" 2>/dev/null || echo "an unknown process"
}

# Empty output = healthy; otherwise the first reason it is not.
why_unhealthy() {
    local port nodes
    for port in "${PORTS[@]}"; do
        [[ "$(cli "$port" ping)" == PONG ]] || { echo "node $port does not answer PING"; return; }
        cli "$port" cluster info | grep -q '^cluster_state:ok' || { echo "node $port: cluster_state is not ok"; return; }
        # A replica still syncing would lose its master's data if promoted now.
        if cli "$port" info replication | grep -q '^role:slave'; then
            cli "$port" info replication | grep -q '^master_link_status:up' ||
                { echo "replica $port is not in sync with its master yet"; return; }
        fi
    done
    nodes="$(cli "${PORTS[0]}" cluster nodes)"
    awk '
        { n++ }
        $3 ~ /fail|handshake|noaddr/ { bad = bad " " $2 "(" $3 ")" }
        $8 != "connected" { bad = bad " " $2 "(link " $8 ")" }
        { for (i = 9; i <= NF; i++) if ($i ~ /^\[/) open = 1 }
        $3 ~ /master/ && NF >= 9 { masters[$1] = 1; nmasters++
            for (i = 9; i <= NF; i++) if ($i !~ /^\[/) { split($i, r, "-"); slots += (r[2] == "" ? 1 : r[2] - r[1] + 1) } }
        $3 ~ /slave/ { replica_of[$4]++; nreplicas++ }
        END {
            if (n != 6) { print n " nodes in the cluster, want 6"; exit }
            if (bad != "") { print "nodes not healthy:" bad; exit }
            if (open) { print "a slot is half-migrated (MIGRATING/IMPORTING left open)"; exit }
            if (nmasters != 3 || nreplicas != 3) { print nmasters " masters with slots and " nreplicas " replicas, want 3 + 3"; exit }
            if (slots != 16384) { print slots " slots assigned, want 16384"; exit }
            for (m in masters) if (!replica_of[m]) { print "master " m " has no replica"; exit }
        }' <<<"$nodes"
}

healthy() { [[ -z "$(why_unhealthy)" ]]; }

wait_healthy() { # seconds
    local deadline=$((SECONDS + $1))
    while ((SECONDS < deadline)); do
        healthy && return 0
        sleep 0.5
    done
    return 1
}

ensure_redis_installed() {
    command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 && return 0
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        log "redis-server is missing: installing the Debian package"
        mkdir -p "$LOCAL"
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; } \
            >"$LOCAL/apt.log" 2>&1; then
            tail -n 20 "$LOCAL/apt.log" >&2
            fail "apt-get install redis-server failed (log: $LOCAL/apt.log)"
            return 1
        fi
    else
        fail "redis-server is missing: install it with: sudo apt-get install -y redis-server"
        return 1
    fi
}

start_node() { # PORT [DIR]: DIR defaults to this checkout's; pid file and log go beside it
    local port="$1" dir="${2:-$LOCAL/$1}"
    local pid_file="$(dirname "$dir")/redis-$port.pid" log_file="$(dirname "$dir")/redis-$port.log"
    mkdir -p "$dir"
    [[ -f "$log_file" ]] && mv -f "$log_file" "$log_file.1"
    # Foreground (daemon.py detaches it and records the real pid). No RDB, no AOF: nothing
    # survives a restart but nodes.conf, the node's identity and view of the cluster. A replica's
    # full sync starts at once (no 5 s diskless-sync delay): a node that rejoins is a usable
    # replica again within a second, which the failover tests wait for.
    python3 "$ROOT/scripts/daemon.py" "$pid_file" "$log_file" -- \
        redis-server --bind "$HOST" --port "$port" --protected-mode yes \
        --cluster-enabled yes --cluster-config-file nodes.conf \
        --cluster-node-timeout "$NODE_TIMEOUT_MS" --cluster-require-full-coverage yes \
        --repl-diskless-sync-delay 0 --save "" --appendonly no --dir "$dir" >/dev/null
}

stop_node() {
    local port="$1" pid="$2" waited=0
    kill -TERM "$pid" 2>/dev/null || true
    while pid_alive "$pid"; do
        if ((waited >= 100)); then
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.2
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    rm -f "$(pidfile "$port")"
}

# Start this checkout's nodes that are not running. Fails if a port is held by someone else.
start_missing() {
    local port started=0
    for port in "${PORTS[@]}"; do
        our_pid "$port" >/dev/null && continue
        rm -f "$(pidfile "$port")"
        if port_open "$port" || port_open $((port + 10000)); then
            fail "port $port (or its bus port $((port + 10000))) is taken by $(port_owner "$port")," \
                "which is not part of a healthy local cluster. Stop it (or free the port) and run again."
            return 1
        fi
        start_node "$port"
        started=$((started + 1))
    done
    echo "$started"
}

wait_pong() {
    local port deadline=$((SECONDS + 20))
    for port in "${PORTS[@]}"; do
        until [[ "$(cli "$port" ping)" == PONG ]]; do
            if ((SECONDS >= deadline)); then
                tail -n 20 "$(logfile "$port")" >&2 || true
                fail "node $port did not answer PING within 20s (log: $(logfile "$port"))"
                return 1
            fi
            sleep 0.1
        done
    done
}

create_from_empty() {
    local port pid addrs=()
    for port in "${PORTS[@]}"; do
        if pid="$(our_pid "$port")"; then stop_node "$port" "$pid"; fi
        rm -rf "${LOCAL:?}/$port"
        addrs+=("$HOST:$port")
    done
    start_missing >/dev/null
    wait_pong
    # --cluster-yes accepts the proposed layout (replicas on the same host as their masters: it
    # is one machine). The first three addresses become the masters.
    if ! timeout 60 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
        >"$LOCAL/create.log" 2>&1; then
        tail -n 30 "$LOCAL/create.log" >&2
        fail "redis-cli --cluster create failed (log: $LOCAL/create.log)"
        return 1
    fi
}

cmd_up() {
    local t0=$SECONDS started ours=0 port
    mkdir -p "$LOCAL"
    if healthy; then
        for port in "${PORTS[@]}"; do our_pid "$port" >/dev/null && ours=$((ours + 1)); done
        if ((ours == ${#PORTS[@]})); then
            log "already up on $HOST:${PORTS[0]}-${PORTS[-1]}: reused"
        else
            log "a healthy cluster already answers on $HOST:${PORTS[0]}-${PORTS[-1]}: reused ($ours of its nodes started by this checkout)"
        fi
        return 0
    fi
    ensure_redis_installed
    local have_conf=1
    for port in "${PORTS[@]}"; do [[ -f "$LOCAL/$port/nodes.conf" ]] || have_conf=0; done
    if ((have_conf)); then
        log "not healthy ($(why_unhealthy)): starting this checkout's missing nodes from their nodes.conf"
        started="$(start_missing)"
        # Nothing to start: a failover, a replica sync or a migration may still be settling.
        local wait_s=$((started > 0 ? TIMEOUT : 10))
        log "started $started node(s); waiting up to ${wait_s}s for the cluster to agree"
        if wait_healthy "$wait_s"; then
            log "repaired in $((SECONDS - t0))s"
            return 0
        fi
        if [[ "$(why_unhealthy)" == *half-migrated* ]]; then
            log "closing the half-migrated slots with redis-cli --cluster fix"
            timeout 120 redis-cli --cluster fix "$HOST:${PORTS[0]}" --cluster-yes >"$LOCAL/fix.log" 2>&1 || true
            if wait_healthy 10; then
                log "repaired in $((SECONDS - t0))s"
                return 0
            fi
        fi
        log "still not healthy ($(why_unhealthy)): recreating it from empty nodes"
    fi
    create_from_empty
    if ! wait_healthy "$TIMEOUT"; then
        fail "not healthy ${TIMEOUT}s after create: $(why_unhealthy) (logs: $LOCAL/redis-*.log)"
        return 1
    fi
    log "up on $HOST:${PORTS[0]}-${PORTS[-1]} (3 masters + 3 replicas) in $((SECONDS - t0))s"
}

cmd_down() {
    local port pid
    for port in "${PORTS[@]}"; do
        if pid="$(our_pid "$port")"; then
            stop_node "$port" "$pid"
            log "node $port stopped"
        elif port_open "$port"; then
            log "node $port not started by this checkout; left running: $(port_owner "$port")"
        fi
        rm -f "$(pidfile "$port")"
        # Forget the node's identity too: the next `up` creates a fresh cluster.
        our_pid "$port" >/dev/null || rm -rf "${LOCAL:?}/$port"
    done
}

cmd_status() {
    local reason port
    reason="$(why_unhealthy)"
    if [[ -z "$reason" ]]; then log "healthy on $HOST:${PORTS[0]}-${PORTS[-1]}"; else log "NOT healthy: $reason"; fi
    for port in "${PORTS[@]}"; do
        local pid="" role
        pid="$(our_pid "$port" || true)"
        role="$( { cli "$port" cluster nodes || true; } | awk '$3 ~ /myself/ { s = ""; for (i = 9; i <= NF; i++) s = s " " $i
            sub(/myself,/, "", $3); print $3 (s == "" ? "" : " slots" s) }')"
        printf '[redis-cluster]   %s:%s %s%s\n' "$HOST" "$port" "${role:-down}" "${pid:+ (pid $pid, this checkout)}"
    done
    [[ -z "$reason" ]]
}

# One up/down at a time on this machine (the ports are machine-wide).
lock() {
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>"${TMPDIR:-/tmp}/session-projector-redis-cluster.lock"
    flock -w 600 9 || { fail "gave up waiting for another redis_cluster.sh"; exit 1; }
}

case "${1:-}" in
    up) lock; cmd_up ;;
    down) lock; cmd_down ;;
    status) cmd_status ;;
    # For the tests: start one node again exactly as `up` does, from DIR (its nodes.conf), after
    # a test killed it (`CONFIG GET dir` told the test where it lived).
    start-node) start_node "$2" "$3" ;;
    *) echo "usage: $0 up|down|status|start-node PORT DIR" >&2; exit 2 ;;
esac
