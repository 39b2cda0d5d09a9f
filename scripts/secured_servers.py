#!/usr/bin/env python3
"""A Kafka and a Cassandra that demand credentials and TLS, for the security settings' end-to-end
test (issue 32 item 6; tests/integration/test_secured_servers.py) or for trying the settings by
hand. Both run from the jars `make services-up` resolved (.local/kafka/lib, .local/cassandra/lib:
nothing is downloaded here), on free ports of 127.0.0.1, with everything they write under DIR.

    .venv/bin/python scripts/secured_servers.py up DIR     start both in a new folder, wait until they serve
    .venv/bin/python scripts/secured_servers.py down DIR   stop both (SIGTERM, then SIGKILL); the data stays
    (`make secured-servers-up` / `make secured-servers-down` do the same in .local/secured, and
    the down deletes the folder)

What `up` makes, with passwords drawn anew each time:

* DIR/tls/: a CA and a server certificate it signed (SAN 127.0.0.1 and localhost), made with the
  JDK's keytool (the JDK the servers run on), in PKCS12 keystores for the servers and as PEM for
  the clients (ca.pem); and untrusted-ca.pem, a second CA that signed nothing the servers show;
* a single-node KRaft Kafka whose only client listener is SASL_SSL with SCRAM-SHA-512 (users
  `projector` and `broker`, the broker's own inter-broker login, added to the storage when it is
  formatted), its controller on a PLAINTEXT listener of its own (the controller serves no
  client);
* a Cassandra with PasswordAuthenticator, CassandraAuthorizer and client_encryption_options
  (TLS required on the native port): role `projector` (login, every permission on every keyspace,
  not a superuser) is created, and the default superuser `cassandra` gets a random password;
* DIR/secured.env: the PROJECTOR_* settings that reach both (shell assignments), and
  DIR/secured.json: the same plus ports, pids and file paths, for a test.

Kafka gets a 384 MB heap, Cassandra 512 MB. Each server's log is DIR/<server>/<server>.log.
Runs with the project's .venv python (its health checks use aiokafka and cassandra-driver).
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / ".local"
HOST = "127.0.0.1"
KAFKA_HEAP = ("-Xms128m", "-Xmx384m")
CASSANDRA_HEAP = ("-Xms512m", "-Xmx512m")
STOP_TIMEOUT_S = 60.0


class SetupError(RuntimeError):
    """One line saying what went wrong (and which log to read)."""


def free_port() -> int:
    """A port free on 127.0.0.1 now, below the ephemeral range (tests/integration/stack.py)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    rng = secrets.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        if low <= port <= high:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return port
    raise SetupError("no free port found in 20000..32000")


# -- certificates ---------------------------------------------------------------------------------


def keytool(*args: str) -> None:
    done = subprocess.run(["keytool", *args], capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise SetupError(f"keytool {args[0]} failed: {(done.stdout + done.stderr).strip()}")


def make_ca(tls: Path, name: str, password: str) -> Path:
    """A self-signed CA in ``{name}.p12``; returns its certificate as PEM (``{name}.pem``)."""
    store = tls / f"{name}.p12"
    keytool(
        *("-genkeypair", "-alias", name, "-keyalg", "RSA", "-keysize", "2048", "-validity", "7"),
        *("-dname", f"CN=session-projector test {name}", "-ext", "bc:c", "-ext", "ku:c=keyCertSign,cRLSign"),
        *("-keystore", str(store), "-storetype", "PKCS12", "-storepass", password),
    )
    pem = tls / f"{name}.pem"
    keytool(
        *("-exportcert", "-rfc", "-alias", name, "-file", str(pem)),
        "-keystore",
        str(store),
        "-storepass",
        password,
    )
    return pem


def make_certificates(tls: Path, password: str) -> dict[str, Path]:
    """The CA, the servers' keystore (key + chain) and truststore (the CA), and an untrusted CA."""
    tls.mkdir(parents=True, exist_ok=True)
    ca_pem = make_ca(tls, "ca", password)
    untrusted = make_ca(tls, "untrusted-ca", password)
    server = tls / "server.p12"
    common = ("-storetype", "PKCS12", "-storepass", password)
    keytool(
        *("-genkeypair", "-alias", "server", "-keyalg", "RSA", "-keysize", "2048", "-validity", "7"),
        *("-dname", "CN=localhost", "-keystore", str(server), *common),
    )
    keytool(
        "-certreq", "-alias", "server", "-keystore", str(server), *common, "-file", str(tls / "server.csr")
    )
    keytool(
        *("-gencert", "-alias", "ca", "-keystore", str(tls / "ca.p12"), *common, "-rfc", "-validity", "7"),
        *("-infile", str(tls / "server.csr"), "-outfile", str(tls / "server.pem")),
        *("-ext", "SAN=ip:127.0.0.1,dns:localhost", "-ext", "ku:c=digitalSignature,keyEncipherment"),
        *("-ext", "eku=serverAuth"),
    )
    # The chain goes into the server's keystore: the CA first (so the reply's chain verifies).
    keytool(
        "-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_pem), "-keystore", str(server), *common
    )
    keytool(
        "-importcert", "-alias", "server", "-file", str(tls / "server.pem"), "-keystore", str(server), *common
    )
    truststore = tls / "truststore.p12"
    keytool(
        "-importcert",
        "-noprompt",
        "-alias",
        "ca",
        "-file",
        str(ca_pem),
        "-keystore",
        str(truststore),
        *common,
    )
    return {"ca": ca_pem, "untrusted_ca": untrusted, "keystore": server, "truststore": truststore}


# -- processes ------------------------------------------------------------------------------------


def spawn(command: list[str], log: Path, pidfile: Path) -> int:
    """Start a server detached (own session, stdin /dev/null, output to `log`); records its pid."""
    with log.open("ab") as out, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            command,
            stdin=devnull,
            stdout=out,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,
        )
    pidfile.write_text(f"{proc.pid}\n")
    return proc.pid


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def is_ours(pid: int, *markers: str) -> bool:
    """The pid is still the server we started (pids get reused): its command line has every marker."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return all(marker in command for marker in markers)


def tail(path: Path, lines: int = 30) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def require_jars(server: str) -> Path:
    """The server's jars in this checkout's .local; resolved here when missing (a checkout whose
    `make services-up` found the servers already running from another one never resolved them)."""
    lib = LOCAL / server / "lib"
    if not any(lib.glob("*.jar")):
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "services.sh"), "jars", server],
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
        if done.returncode != 0 or not any(lib.glob("*.jar")):
            raise SetupError(
                f"{lib} has no jars and `scripts/services.sh jars {server}` could not resolve them: "
                + (done.stderr.strip().splitlines() or ["no output"])[-1]
            )
    return lib


# -- Kafka ----------------------------------------------------------------------------------------

KAFKA_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{host}:{controller}
listeners=SASL_SSL://{host}:{port},CONTROLLER://{host}:{controller}
advertised.listeners=SASL_SSL://{host}:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_SSL
listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={jaas}
ssl.keystore.type=PKCS12
ssl.keystore.location={keystore}
ssl.keystore.password={store_password}
ssl.key.password={store_password}
ssl.truststore.type=PKCS12
ssl.truststore.location={truststore}
ssl.truststore.password={store_password}
ssl.client.auth=none
log.dirs={data}
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
log.segment.bytes=67108864
num.network.threads=2
num.io.threads=2
num.recovery.threads.per.data.dir=1
"""


def kafka_jvm(folder: Path, lib: Path) -> list[str]:
    return [
        *(
            "java",
            "-Dprojector.service=kafka-secured",
            *KAFKA_HEAP,
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
        ),
        *(f"-Dlog4j.configuration=file:{folder}/log4j.properties", f"-Dkafka.logs.dir={folder}/logs"),
        *("-cp", f"{lib}/*"),
    ]


def start_kafka(folder: Path, files: dict[str, Path], secrets_: dict[str, str]) -> dict[str, Any]:
    lib = require_jars("kafka")
    folder.mkdir(parents=True, exist_ok=True)
    port, controller = free_port(), free_port()
    properties = folder / "server.properties"
    properties.write_text(
        KAFKA_PROPERTIES.format(
            host=HOST,
            port=port,
            controller=controller,
            jaas=(
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="broker" password="{secrets_["kafka_broker_password"]}";'
            ),
            keystore=files["keystore"],
            truststore=files["truststore"],
            store_password=secrets_["store_password"],
            data=folder / "data",
        )
    )
    (folder / "log4j.properties").write_text((ROOT / "scripts/kafka/log4j.properties").read_text())
    log = folder / "kafka.log"
    cluster_id = base64.urlsafe_b64encode(uuid.UUID(int=uuid.uuid4().int >> 1).bytes).decode().rstrip("=")
    scram = [
        f"SCRAM-SHA-512=[name=broker,password={secrets_['kafka_broker_password']}]",
        f"SCRAM-SHA-512=[name=projector,password={secrets_['kafka_password']}]",
    ]
    with log.open("ab") as out:
        done = subprocess.run(
            [
                *kafka_jvm(folder, lib),
                *("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties)),
                *(arg for user in scram for arg in ("--add-scram", user)),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
            timeout=180,
        )
    if done.returncode != 0:
        raise SetupError(f"formatting the secured Kafka's storage failed:\n{tail(log)}")
    pid = spawn([*kafka_jvm(folder, lib), "kafka.Kafka", str(properties)], log, folder / "kafka.pid")
    return {"port": port, "controller_port": controller, "pid": pid, "log": str(log)}


def kafka_serves(port: int, ca: Path, password: str) -> str | None:
    """None when the SASL_SSL listener authenticates `projector` and names a controller, else why not."""
    import asyncio
    import ssl

    from aiokafka.admin import AIOKafkaAdminClient

    async def probe() -> str | None:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=f"{HOST}:{port}",
            security_protocol="SASL_SSL",
            ssl_context=ssl.create_default_context(cafile=str(ca)),
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="projector",
            sasl_plain_password=password,
            request_timeout_ms=5000,
        )
        try:
            await asyncio.wait_for(admin.start(), 10)
            found = await asyncio.wait_for(admin.describe_cluster(), 10)
            if not found.get("brokers") or int(found.get("controller_id", -1)) < 0:
                return f"no broker or controller yet: {found}"
            return None
        except Exception as exc:  # still starting: any error is "not yet", with its reason
            return f"{type(exc).__name__}: {exc}"
        finally:
            await admin.close()

    return asyncio.run(probe())


# -- Cassandra ------------------------------------------------------------------------------------

CASSANDRA_SECURITY = """
# Issue 32 item 6: passwords, permissions and TLS on the native port (scripts/secured_servers.py).
authenticator: PasswordAuthenticator
authorizer: CassandraAuthorizer
role_manager: CassandraRoleManager
client_encryption_options:
  enabled: true
  optional: false
  keystore: {keystore}
  keystore_password: {store_password}
  store_type: PKCS12
  require_client_auth: false
"""


def cassandra_yaml(folder: Path, port: int, storage_port: int, keystore: Path, store_password: str) -> str:
    """The shared Cassandra's configuration (scripts/cassandra/cassandra.yaml) on other ports and
    data folders, plus authentication, authorization and client TLS."""
    text = (ROOT / "scripts/cassandra/cassandra.yaml").read_text().replace("@DATA@", str(folder))
    replacements = [
        (r"(?m)^cluster_name:.*$", "cluster_name: session-projector-secured"),
        (r"(?m)^storage_port:.*$", f"storage_port: {storage_port}"),
        (r"(?m)^native_transport_port:.*$", f"native_transport_port: {port}"),
        (r'seeds: "127\.0\.0\.1:\d+"', f'seeds: "{HOST}:{storage_port}"'),
    ]
    for pattern, replacement in replacements:
        text, count = re.subn(pattern, replacement, text)
        if count != 1:
            raise SetupError(f"scripts/cassandra/cassandra.yaml: expected one {pattern!r}, found {count}")
    for key in ("authenticator:", "authorizer:", "client_encryption_options:"):
        if re.search(rf"(?m)^{key}", text):
            raise SetupError(f"scripts/cassandra/cassandra.yaml sets {key} already: this script adds it")
    return text + CASSANDRA_SECURITY.format(keystore=keystore, store_password=store_password)


def start_cassandra(folder: Path, files: dict[str, Path], secrets_: dict[str, str]) -> dict[str, Any]:
    lib = require_jars("cassandra")
    for sub in ("data", "logs", "triggers"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    port, storage_port = free_port(), free_port()
    config = folder / "cassandra.yaml"
    config.write_text(
        cassandra_yaml(folder, port, storage_port, files["keystore"], secrets_["store_password"])
    )
    (folder / "logback.xml").write_text((ROOT / "scripts/cassandra/logback.xml").read_text())
    options = [
        line.strip()
        for line in (ROOT / "scripts/cassandra/jvm17.options").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    jamm = sorted(lib.glob("jamm-*.jar"))
    if jamm:
        options.append(f"-javaagent:{jamm[0]}")
    log = folder / "cassandra.log"
    pid = spawn(
        [
            *("java", "-Dprojector.service=cassandra-secured", *CASSANDRA_HEAP, "-Xss512k", "-XX:+UseG1GC"),
            *("-XX:+CrashOnOutOfMemoryError", "-Djava.net.preferIPv4Stack=true", "-Djava.awt.headless=true"),
            *options,
            "-Dcassandra-foreground=yes",
            f"-Dcassandra.config=file://{config}",
            f"-Dcassandra.storagedir={folder}/data",
            f"-Dcassandra.logdir={folder}/logs",
            f"-Dcassandra.triggers_dir={folder}/triggers",
            f"-Dlogback.configurationFile=file://{folder}/logback.xml",
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            "-Dcassandra.ring_delay_ms=1000",
            "-Dcassandra.load_ring_state=false",
            "-Dcassandra.superuser_setup_delay_ms=0",
            *("-cp", f"{lib}/*", "org.apache.cassandra.service.CassandraDaemon"),
        ],
        log,
        folder / "cassandra.pid",
    )
    return {"port": port, "storage_port": storage_port, "pid": pid, "log": str(log)}


def cassandra_session(port: int, ca: Path, username: str, password: str) -> tuple[Any, Any]:
    import ssl

    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import Cluster

    cluster = Cluster(
        [HOST],
        port=port,
        protocol_version=5,
        connect_timeout=5,
        ssl_context=ssl.create_default_context(cafile=str(ca)),
        auth_provider=PlainTextAuthProvider(username=username, password=password),
    )
    try:
        return cluster, cluster.connect()
    except Exception:
        cluster.shutdown()
        raise


def set_up_roles(port: int, ca: Path, secrets_: dict[str, str]) -> str | None:
    """Once the default superuser can log in: role `projector` with every permission on every
    keyspace, and a random password for `cassandra`. None when done (or done before), else why not."""
    from cassandra import AuthenticationFailed  # type: ignore[attr-defined,unused-ignore]
    from cassandra.cluster import NoHostAvailable

    try:
        cluster, session = cassandra_session(port, ca, "cassandra", "cassandra")
    except NoHostAvailable as exc:
        errors = getattr(exc, "errors", {}) or {}
        if any(isinstance(err, AuthenticationFailed) for err in errors.values()):
            # The default password is gone: a previous round finished, if projector logs in.
            try:
                cluster, _ = cassandra_session(port, ca, "projector", secrets_["cassandra_password"])
            except Exception as again:
                return f"{type(again).__name__}: {again}"
            cluster.shutdown()
            return None
        return f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    try:
        password = secrets_["cassandra_password"].replace("'", "''")
        session.execute(f"CREATE ROLE IF NOT EXISTS projector WITH PASSWORD = '{password}' AND LOGIN = true")
        session.execute("GRANT ALL PERMISSIONS ON ALL KEYSPACES TO projector")
        superuser = secrets_["cassandra_superuser_password"].replace("'", "''")
        session.execute(f"ALTER ROLE cassandra WITH PASSWORD = '{superuser}'")
    except Exception as exc:  # system_auth not ready yet, say: try again
        return f"{type(exc).__name__}: {exc}"
    finally:
        cluster.shutdown()
    return None


# -- up / down ------------------------------------------------------------------------------------


def wait_until(what: str, check: Any, pid: int, log: Path, deadline: float) -> None:
    reason = "not tried"
    while True:
        if not pid_alive(pid):
            raise SetupError(f"the secured {what} exited while starting:\n{tail(log)}")
        reason = check()
        if reason is None:
            return
        if time.monotonic() > deadline:
            raise SetupError(f"the secured {what} is not serving: {reason} (log: {log})\n{tail(log)}")
        time.sleep(1.0)


def up(folder: Path, timeout: float) -> dict[str, Any]:
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "secured.json").exists():
        raise SetupError(f"{folder} already holds secured servers: `down` them first, or give another folder")
    if any((folder / name).exists() for name in ("tls", "kafka", "cassandra")):
        # Their storage holds the users and passwords of that run: new ones would not log in.
        raise SetupError(f"{folder} holds the data of an earlier run: delete it, or give another folder")
    secrets_ = {
        name: secrets.token_urlsafe(18)
        for name in (
            "store_password",
            "kafka_password",
            "kafka_broker_password",
            "cassandra_password",
            "cassandra_superuser_password",
        )
    }
    files = make_certificates(folder / "tls", secrets_["store_password"])
    state: dict[str, Any] = {
        "folder": str(folder),
        "ca": str(files["ca"]),
        "untrusted_ca": str(files["untrusted_ca"]),
    }
    # Written before the servers start: `down` finds their pids even if `up` fails half way.
    state_file = folder / "secured.json"
    try:
        state["cassandra"] = start_cassandra(folder / "cassandra", files, secrets_)
        state_file.write_text(json.dumps(state, indent=2))
        state["kafka"] = start_kafka(folder / "kafka", files, secrets_)
        state_file.write_text(json.dumps(state, indent=2))
        deadline = time.monotonic() + timeout
        logging.disable(logging.CRITICAL)  # the drivers' line per refused connect while they boot
        kafka, cassandra = state["kafka"], state["cassandra"]
        wait_until(
            "Kafka",
            lambda: kafka_serves(kafka["port"], files["ca"], secrets_["kafka_password"]),
            kafka["pid"],
            Path(kafka["log"]),
            deadline,
        )
        wait_until(
            "Cassandra",
            lambda: set_up_roles(cassandra["port"], files["ca"], secrets_),
            cassandra["pid"],
            Path(cassandra["log"]),
            deadline,
        )
    except BaseException:
        down(folder)
        raise
    env = {
        "PROJECTOR_KAFKA_BOOTSTRAP": f"{HOST}:{state['kafka']['port']}",
        "PROJECTOR_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "PROJECTOR_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "PROJECTOR_KAFKA_SASL_USERNAME": "projector",
        "PROJECTOR_KAFKA_SASL_PASSWORD": secrets_["kafka_password"],
        "PROJECTOR_KAFKA_SSL_CAFILE": str(files["ca"]),
        "PROJECTOR_CASSANDRA_CONTACT_POINTS": HOST,
        "PROJECTOR_CASSANDRA_PORT": str(state["cassandra"]["port"]),
        "PROJECTOR_CASSANDRA_USERNAME": "projector",
        "PROJECTOR_CASSANDRA_PASSWORD": secrets_["cassandra_password"],
        "PROJECTOR_CASSANDRA_SSL": "true",
        "PROJECTOR_CASSANDRA_SSL_CAFILE": str(files["ca"]),
    }
    state["env"] = env
    state_file.write_text(json.dumps(state, indent=2))
    (folder / "secured.env").write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))
    return state


def down(folder: Path) -> list[str]:
    """SIGTERM to both servers at once, then wait (SIGKILL after STOP_TIMEOUT_S). What was stopped."""
    folder = folder.resolve()
    running: list[tuple[str, int]] = []
    for name, marker in (
        ("kafka", "-Dprojector.service=kafka-secured"),
        ("cassandra", "-Dprojector.service=cassandra-secured"),
    ):
        pidfile = folder / name / f"{name}.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        if pid_alive(pid) and is_ours(pid, marker, f"{folder}/{name}/"):
            os.kill(pid, signal.SIGTERM)
            running.append((name, pid))
        pidfile.unlink(missing_ok=True)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    stopped = []
    for name, pid in running:
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            stopped.append(f"{name} (pid {pid}, SIGKILL after {STOP_TIMEOUT_S:g} s)")
        else:
            stopped.append(f"{name} (pid {pid})")
    (folder / "secured.json").unlink(missing_ok=True)
    return stopped


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("folder", type=Path, help="where the certificates, data, logs and pids go")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for both to serve")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        if args.command == "up":
            state = up(args.folder, args.timeout)
            print(
                f"secured servers: Kafka SASL_SSL on {HOST}:{state['kafka']['port']}, Cassandra with TLS "
                f"and passwords on {HOST}:{state['cassandra']['port']} ({time.monotonic() - started:.0f} s); "
                f"settings in {args.folder.resolve() / 'secured.env'}"
            )
        else:
            stopped = down(args.folder)
            print(f"secured servers: stopped {', '.join(stopped) or 'nothing (none running)'}")
    except SetupError as exc:
        print(f"secured servers: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
