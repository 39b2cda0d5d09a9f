#!/usr/bin/env bash
# Local Redis, Kafka (KRaft) and Cassandra on 127.0.0.1 for `make run` / `make test`.
#
#   scripts/services.sh up      install what is missing, start what is not healthy, wait for health
#   scripts/services.sh down    stop the servers this checkout started
#   scripts/services.sh status  one line per server
#   scripts/services.sh jars kafka|cassandra   resolve a server's jars into .local/<server>/lib only
#
# Everything a server writes (jars, config, data, log, pid) lives under .local/<server>/ of the
# checkout. A server that already answers a real health check on its port is REUSED, whichever
# checkout started it: a second `make test` (or a fresh clone next to a running checkout) costs no
# start-up. `down` stops only servers whose pid file is in this checkout's .local/.
#
# Ports: Redis 6379; Kafka 9092 (+ controller 19093); Cassandra 9042 (+ storage 7000).
# Time limits (seconds) can be raised through the environment: SERVICES_REDIS_TIMEOUT,
# SERVICES_KAFKA_TIMEOUT, SERVICES_CASSANDRA_TIMEOUT.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SCRIPTS="$ROOT/scripts"
LOCAL="$ROOT/.local"
PY="$ROOT/.venv/bin/python"
HOST=127.0.0.1

REDIS_PORT=6379
KAFKA_PORT=9092
KAFKA_CONTROLLER_PORT=19093
CASSANDRA_PORT=9042
CASSANDRA_STORAGE_PORT=7000

REDIS_TIMEOUT="${SERVICES_REDIS_TIMEOUT:-30}"
KAFKA_TIMEOUT="${SERVICES_KAFKA_TIMEOUT:-180}"
CASSANDRA_TIMEOUT="${SERVICES_CASSANDRA_TIMEOUT:-300}"
STOP_TIMEOUT=60

SERVICES=(redis kafka cassandra)

log() { printf '[%s] %s\n' "$1" "${*:2}"; }
fail() { printf '[%s] ERROR: %s\n' "$1" "${*:2}" >&2; return 1; }

main_port() {
    case "$1" in
        redis) echo "$REDIS_PORT" ;;
        kafka) echo "$KAFKA_PORT" ;;
        cassandra) echo "$CASSANDRA_PORT" ;;
    esac
}

# Every port the server binds: all must be free before we start one.
all_ports() {
    case "$1" in
        redis) echo "$REDIS_PORT" ;;
        kafka) echo "$KAFKA_PORT $KAFKA_CONTROLLER_PORT" ;;
        cassandra) echo "$CASSANDRA_PORT $CASSANDRA_STORAGE_PORT" ;;
    esac
}

timeout_of() {
    case "$1" in
        redis) echo "$REDIS_TIMEOUT" ;;
        kafka) echo "$KAFKA_TIMEOUT" ;;
        cassandra) echo "$CASSANDRA_TIMEOUT" ;;
    esac
}

pidfile() { echo "$LOCAL/$1/$1.pid"; }
logfile() { echo "$LOCAL/$1/$1.log"; }

# What the process's command line must contain for a pid file to count as ours (pids get reused).
marker() {
    case "$1" in
        redis) echo "redis-server" ;;
        *) echo "-Dprojector.service=$1" ;;
    esac
}

pid_alive() {
    local pid="$1" state
    kill -0 "$pid" 2>/dev/null || return 1
    # A zombie still answers kill -0.
    state="$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo Z)"
    [[ "$state" != "Z" ]]
}

# Prints the pid from this checkout's pid file if that process is alive and is the server.
our_pid() {
    local svc="$1" f pid
    f="$(pidfile "$svc")"
    [[ -f "$f" ]] || return 1
    pid="$(tr -dc '0-9' <"$f")"
    [[ -n "$pid" ]] || return 1
    pid_alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$(marker "$svc")" || return 1
    echo "$pid"
}

port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
}

port_owner() {
    python3 "$SCRIPTS/portowner.py" "$1" 2>/dev/null || echo "an unknown process (not visible from here)"
}

# One health probe; with a wait, keeps probing (and gives up early if PID exits).
healthy() {
    local svc="$1" wait="${2:-0}" pid="${3:-}"
    if [[ "$svc" == redis && "$wait" == 0 ]]; then
        # Fast path that needs no .venv (status/down work before `make setup`).
        [[ "$(timeout 3 redis-cli -h "$HOST" -p "$REDIS_PORT" ping 2>/dev/null || true)" == "PONG" ]]
        return
    fi
    if [[ ! -x "$PY" ]]; then
        # Without the venv only a TCP probe is possible (status/down before setup).
        port_open "$(main_port "$svc")"
        return
    fi
    local args=("$svc" "$HOST:$(main_port "$svc")" --wait "$wait")
    [[ -n "$pid" ]] && args+=(--pid "$pid")
    [[ "$wait" == 0 ]] && args+=(--quiet)
    "$PY" "$SCRIPTS/healthcheck.py" "${args[@]}"
}

show_log_tail() {
    local svc="$1" f
    f="$(logfile "$svc")"
    if [[ -f "$f" ]]; then
        printf '[%s] ---- last 40 lines of %s ----\n' "$svc" "$f" >&2
        tail -n 40 "$f" | sed "s/^/[$svc]   /" >&2
    fi
}

stop_pid() {
    local svc="$1" pid="$2" waited=0
    kill -TERM "$pid" 2>/dev/null || true
    while pid_alive "$pid"; do
        if ((waited >= STOP_TIMEOUT)); then
            log "$svc" "pid $pid ignored SIGTERM for ${STOP_TIMEOUT}s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            sleep 1
            break
        fi
        sleep 1
        waited=$((waited + 1))
    done
    rm -f "$(pidfile "$svc")"
}

require_java() {
    if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
        fail "$1" "Java 17 and Maven are needed to run Kafka and Cassandra (jars come from Maven Central)." \
            "Install them with: apt-get update && apt-get install -y openjdk-17-jdk-headless maven"
        return 1
    fi
    local major
    major="$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')"
    if [[ -z "$major" || "${major%%.*}" -lt 17 ]]; then
        fail "$1" "Java 17+ is needed (found java.specification.version=${major:-unknown})." \
            "Install it with: apt-get install -y openjdk-17-jdk-headless"
        return 1
    fi
}

# Resolve a server's jars into .local/<svc>/lib with mvn (cached in ~/.m2). Re-resolved only when
# the pom changes (its hash is kept next to the jars).
resolve_jars() {
    local svc="$1" pom="$SCRIPTS/$1/pom.xml" lib="$LOCAL/$1/lib" want have t0
    want="$(sha256sum "$pom" | cut -d' ' -f1)"
    have="$(cat "$lib/.pom.sha256" 2>/dev/null || true)"
    [[ "$want" == "$have" ]] && return 0
    t0=$SECONDS
    log "$svc" "resolving jars from Maven Central (first start only; cached in ~/.m2)..."
    rm -rf "$lib.tmp"
    mkdir -p "$lib.tmp"
    if ! mvn -B -q -Dstyle.color=never -f "$pom" \
        org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$lib.tmp" >"$LOCAL/$svc/mvn.log" 2>&1; then
        tail -n 30 "$LOCAL/$svc/mvn.log" | sed "s/^/[$svc]   /" >&2
        fail "$svc" "mvn could not resolve the jars (log: $LOCAL/$svc/mvn.log)"
        return 1
    fi
    echo "$want" >"$lib.tmp/.pom.sha256"
    rm -rf "$lib"
    mv "$lib.tmp" "$lib"
    log "$svc" "jars resolved in $((SECONDS - t0))s ($(find "$lib" -name '*.jar' | wc -l) jars)"
}

render() { # template -> file, @DATA@ -> the server's .local folder
    sed "s#@DATA@#$LOCAL/$2#g" "$1" >"$3"
}

start_redis() {
    if ! command -v redis-server >/dev/null 2>&1; then
        if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            log redis "redis-server is missing: installing the Debian package"
            if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; } \
                >"$LOCAL/redis/apt.log" 2>&1; then
                tail -n 20 "$LOCAL/redis/apt.log" >&2
                fail redis "apt-get install redis-server failed (log: $LOCAL/redis/apt.log)"
                return 1
            fi
            # Debian's package may have started its own redis (init script) on 6379: that one is
            # healthy and will simply be reused.
            if healthy redis; then return 0; fi
        else
            fail redis "redis-server is missing: install it with: sudo apt-get install -y redis-server"
            return 1
        fi
    fi
    # Foreground (no --daemonize): daemon.py detaches it and records the real pid.
    python3 "$SCRIPTS/daemon.py" "$(pidfile redis)" "$(logfile redis)" -- \
        redis-server --bind "$HOST" --port "$REDIS_PORT" --save "" --appendonly no \
        --dir "$LOCAL/redis" --protected-mode yes >/dev/null
}

start_kafka() {
    local dir="$LOCAL/kafka" cluster_id
    require_java kafka
    resolve_jars kafka
    mkdir -p "$dir/data" "$dir/logs"
    render "$SCRIPTS/kafka/server.properties" kafka "$dir/server.properties"
    cp "$SCRIPTS/kafka/log4j.properties" "$dir/log4j.properties"
    local jvm=(java -Xms512m -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true
        "-Dlog4j.configuration=file:$dir/log4j.properties" "-Dkafka.logs.dir=$dir/logs"
        -cp "$dir/lib/*")
    if [[ ! -f "$dir/data/meta.properties" ]]; then
        # KRaft storage must be formatted once with a cluster id: 22 chars of base64url, not
        # starting with '-' (the tools would read it as an option).
        cluster_id="$(python3 -c 'import base64,uuid
while True:
    s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    if not s.startswith("-"):
        print(s); break')"
        log kafka "formatting KRaft storage (cluster id $cluster_id)"
        if ! "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" \
            --ignore-formatted >>"$(logfile kafka)" 2>&1; then
            show_log_tail kafka
            fail kafka "formatting the storage failed"
            return 1
        fi
    fi
    python3 "$SCRIPTS/daemon.py" "$(pidfile kafka)" "$(logfile kafka)" -- \
        "${jvm[@]:0:1}" -Dprojector.service=kafka "${jvm[@]:1}" kafka.Kafka "$dir/server.properties" >/dev/null
}

start_cassandra() {
    local dir="$LOCAL/cassandra" jamm opts=()
    require_java cassandra
    resolve_jars cassandra
    mkdir -p "$dir/data" "$dir/logs" "$dir/triggers"
    render "$SCRIPTS/cassandra/cassandra.yaml" cassandra "$dir/cassandra.yaml"
    cp "$SCRIPTS/cassandra/logback.xml" "$dir/logback.xml"
    mapfile -t opts < <(grep -v '^[[:space:]]*\(#\|$\)' "$SCRIPTS/cassandra/jvm17.options")
    # jamm measures object sizes for memtable accounting; without the agent Cassandra falls back to
    # a slower estimate, so use it when mvn brought it.
    jamm="$(find "$dir/lib" -name 'jamm-*.jar' | head -n 1)"
    [[ -n "$jamm" ]] && opts+=("-javaagent:$jamm")
    python3 "$SCRIPTS/daemon.py" "$(pidfile cassandra)" "$(logfile cassandra)" -- \
        java -Dprojector.service=cassandra \
        -Xms1g -Xmx1g -Xss512k -XX:+UseG1GC -XX:MaxGCPauseMillis=300 -XX:+ParallelRefProcEnabled \
        -XX:+HeapDumpOnOutOfMemoryError "-XX:HeapDumpPath=$dir/logs" -XX:+CrashOnOutOfMemoryError \
        -Djava.net.preferIPv4Stack=true -Djava.awt.headless=true \
        "${opts[@]}" \
        -Dcassandra-foreground=yes \
        "-Dcassandra.config=file://$dir/cassandra.yaml" \
        "-Dcassandra.storagedir=$dir/data" \
        "-Dcassandra.logdir=$dir/logs" \
        "-Dcassandra.triggers_dir=$dir/triggers" \
        "-Dlogback.configurationFile=file://$dir/logback.xml" \
        -Dcassandra.skip_wait_for_gossip_to_settle=0 \
        -Dcassandra.ring_delay_ms=1000 \
        -Dcassandra.load_ring_state=false \
        -Dcassandra.superuser_setup_delay_ms=0 \
        -cp "$dir/lib/*" org.apache.cassandra.service.CassandraDaemon >/dev/null
}

# Bring one server up (runs in a background subshell per server; returns non-zero on failure).
up_one() {
    local svc="$1" t0=$SECONDS pid port
    mkdir -p "$LOCAL/$svc"
    if healthy "$svc"; then
        if pid="$(our_pid "$svc")"; then
            log "$svc" "already running (pid $pid): reused"
        else
            log "$svc" "a healthy server already answers on $HOST:$(main_port "$svc"): reused (started outside this checkout: $(port_owner "$(main_port "$svc")"))"
        fi
        return 0
    fi
    if pid="$(our_pid "$svc")"; then
        # Alive but not answering: most likely still booting (another `up` started it moments ago).
        log "$svc" "pid $pid is running but not healthy yet: waiting up to $(timeout_of "$svc")s"
        if healthy "$svc" "$(timeout_of "$svc")" "$pid"; then
            log "$svc" "ready after $((SECONDS - t0))s"
            return 0
        fi
        log "$svc" "pid $pid never became healthy: restarting it"
        show_log_tail "$svc"
        stop_pid "$svc" "$pid"
    elif [[ -f "$(pidfile "$svc")" ]]; then
        log "$svc" "removing stale pid file (process $(tr -dc '0-9' <"$(pidfile "$svc")") is gone)"
        rm -f "$(pidfile "$svc")"
    fi
    for port in $(all_ports "$svc"); do
        if port_open "$port"; then
            fail "$svc" "port $port is taken by $(port_owner "$port"), which is not a healthy $svc." \
                "Stop that process (or free the port) and run again."
            return 1
        fi
    done
    # Keep the previous run's log for post-mortems; start a fresh one.
    [[ -f "$(logfile "$svc")" ]] && mv -f "$(logfile "$svc")" "$(logfile "$svc").1"
    "start_$svc"
    pid="$(tr -dc '0-9' <"$(pidfile "$svc")")"
    log "$svc" "started pid $pid (log: $(logfile "$svc")); waiting up to $(timeout_of "$svc")s for health"
    if ! healthy "$svc" "$(timeout_of "$svc")" "$pid"; then
        show_log_tail "$svc"
        fail "$svc" "not healthy after $((SECONDS - t0))s (full log: $(logfile "$svc"))"
        return 1
    fi
    log "$svc" "ready on $HOST:$(main_port "$svc") in $((SECONDS - t0))s"
}

cmd_up() {
    local t0=$SECONDS svc failed=0
    if [[ ! -x "$PY" ]]; then
        echo "services.sh: $PY is missing: run \`make setup\` first (\`make services-up\` does)." >&2
        exit 1
    fi
    mkdir -p "$LOCAL"
    # Start the three in parallel: the JVMs' boots overlap and the jar downloads share the network.
    declare -A jobs=()
    for svc in "${SERVICES[@]}"; do
        up_one "$svc" &
        jobs[$svc]=$!
    done
    for svc in "${SERVICES[@]}"; do
        if ! wait "${jobs[$svc]}"; then
            failed=1
        fi
    done
    if ((failed)); then
        echo "services.sh: some servers did not start (see the errors above); \`make services-status\` shows the state." >&2
        exit 1
    fi
    echo "services.sh: Redis $HOST:$REDIS_PORT, Kafka $HOST:$KAFKA_PORT, Cassandra $HOST:$CASSANDRA_PORT are up ($((SECONDS - t0))s)"
}

cmd_down() {
    local svc pid port
    for svc in "${SERVICES[@]}"; do
        port="$(main_port "$svc")"
        if pid="$(our_pid "$svc")"; then
            log "$svc" "stopping pid $pid"
            stop_pid "$svc" "$pid"
            log "$svc" "stopped"
        else
            rm -f "$(pidfile "$svc")"
            if port_open "$port"; then
                log "$svc" "not started by this checkout; left running on $HOST:$port: $(port_owner "$port")"
            else
                log "$svc" "not running"
            fi
        fi
    done
}

cmd_status() {
    local svc pid port state rc=0
    for svc in "${SERVICES[@]}"; do
        port="$(main_port "$svc")"
        if healthy "$svc"; then state="healthy"; else state="DOWN"; rc=1; fi
        if pid="$(our_pid "$svc")"; then
            log "$svc" "$state on $HOST:$port (pid $pid, this checkout; log $(logfile "$svc"))"
        elif [[ "$state" == healthy ]]; then
            log "$svc" "$state on $HOST:$port (not started by this checkout: $(port_owner "$port"))"
        else
            log "$svc" "$state"
        fi
    done
    return "$rc"
}

# One `up`/`down` at a time on this machine (ports are machine-wide, so the lock is too, shared by
# every checkout): two concurrent `make test` would otherwise both start a server, and the loser's
# pid file would point at a process that died on "address in use".
lock() {
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>"${TMPDIR:-/tmp}/session-projector-services.lock"
    if ! flock -n 9; then
        echo "services.sh: another services.sh up/down is running; waiting for it (up to 10 min)..."
        flock -w 600 9 || { echo "services.sh: gave up waiting for the lock" >&2; exit 1; }
    fi
}

case "${1:-}" in
    up)
        lock
        cmd_up
        ;;
    down)
        lock
        cmd_down
        ;;
    status) cmd_status ;;
    jars)
        # Resolve a server's jars only (scripts/kafka_cluster.sh runs its brokers from Kafka's).
        lock
        shift
        for svc in "$@"; do
            mkdir -p "$LOCAL/$svc"
            require_java "$svc"
            resolve_jars "$svc"
        done
        ;;
    *)
        echo "usage: $0 up|down|status|jars SERVER..." >&2
        exit 2
        ;;
esac
