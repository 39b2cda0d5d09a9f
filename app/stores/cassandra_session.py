"""Opening a Cassandra session from its settings section (one place for the driver's connection options)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.settings import CassandraSettings

# Cassandra 4.0+ (we run 5.0) speaks native protocol v5. Pinning it skips the driver's
# negotiation round trips (and their warnings) on every connect.
PROTOCOL_VERSION = 5


class CassandraUnavailable(RuntimeError):
    """Cassandra could not be reached or refused the session."""


def build_cluster(cassandra: CassandraSettings, *, connect_timeout: float = 10.0) -> Any:
    """The driver's ``Cluster`` for the settings, not yet connected.

    The driver is imported here, not at module level, so importing the package stays cheap.
    """
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy

    from app.connections import cassandra_cluster_options

    # An explicit policy: the driver warns (and will refuse in its next major) without one.
    # Token-aware routing sends single-partition reads (the unread recompute) to a replica; the
    # DC-aware child keeps them in the local data center ('' = the first contact point's).
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(
            DCAwareRoundRobinPolicy(local_dc=cassandra.cassandra_local_dc)
        ),
        request_timeout=30.0,
    )
    return Cluster(
        list(cassandra.cassandra_contact_points),
        port=cassandra.cassandra_port,
        protocol_version=PROTOCOL_VERSION,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=connect_timeout,
        **cassandra_cluster_options(cassandra),  # authentication, TLS (app/connections.py)
    )


def open_cluster(
    cassandra: CassandraSettings, *, connect_timeout: float = 10.0, require_keyspace: bool = False
) -> tuple[Any, Any]:
    """Connect; returns ``(cluster, session)``. The caller owns ``cluster.shutdown()``.
    Raises :class:`CassandraUnavailable` with one line saying what to check.

    With `require_keyspace`, also when the keyspace does not exist: otherwise the
    first statement prepared in it makes the driver log a traceback (`projector api` printed one
    before its error line, `projector rebuild --from-state` died in one)."""
    from cassandra import UnresolvableContactPoints
    from cassandra.cluster import NoHostAvailable

    from app.connections import quiet_logger, unreachable_hint

    points = ",".join(cassandra.cassandra_contact_points)
    hint = unreachable_hint(cassandra.cassandra_contact_points)
    try:
        cluster = build_cluster(cassandra, connect_timeout=connect_timeout)
    except UnresolvableContactPoints:
        # The driver's own message is an empty dict: say which names did not resolve.
        raise CassandraUnavailable(
            f"cannot resolve the Cassandra contact points {points} (PROJECTOR_CASSANDRA_CONTACT_POINTS): "
            "no such host name"
        ) from None
    try:
        # The driver logs each failed attempt with a traceback; the error below says it once.
        with quiet_logger("cassandra"):
            session = cluster.connect()
    except NoHostAvailable as exc:
        cluster.shutdown()
        raise CassandraUnavailable(
            refusal(exc)
            or f"cannot reach Cassandra at {points} port {cassandra.cassandra_port} ({_reasons(exc)}){hint}"
        ) from None
    if require_keyspace and cassandra.cassandra_keyspace not in cluster.metadata.keyspaces:
        cluster.shutdown()
        raise CassandraUnavailable(missing_keyspace(cassandra.cassandra_keyspace))
    return cluster, session


def missing_keyspace(keyspace: str) -> str:
    """The one line for a keyspace that is not there (every command says it the same way)."""
    return (
        f"keyspace {keyspace!r} (PROJECTOR_CASSANDRA_KEYSPACE) does not exist in Cassandra: "
        "create it with `projector bootstrap`"
    )


def refusal(exc: Any) -> str | None:
    """When Cassandra answered and refused this client (its login, or its TLS certificate was not
    trusted here), the line naming the settings to fix; None otherwise (not reached)."""
    from cassandra import AuthenticationFailed

    from app.connections import tls_refusal

    errors = getattr(exc, "errors", None)
    if not isinstance(errors, dict):
        return None
    for host, err in errors.items():
        if isinstance(err, AuthenticationFailed):
            # "Failed to authenticate to H: Error from server: code=0100 [Bad credentials] message=..."
            said = str(err)
            detail = said.partition('message="')[2].rstrip('"') or said
            return (
                f"Cassandra at {host} refused the login: {detail}; check PROJECTOR_CASSANDRA_USERNAME "
                "and PROJECTOR_CASSANDRA_PASSWORD"
            )
        # The driver re-raises a failed TLS handshake as a socket error carrying the text only.
        if "CERTIFICATE_VERIFY_FAILED" in str(err):
            return tls_refusal("Cassandra", host, str(err), "PROJECTOR_CASSANDRA_SSL_CAFILE")
    return None


def _reasons(exc: Any) -> str:
    """NoHostAvailable's per-host errors in one short line (its str() is a nested repr)."""
    errors = getattr(exc, "errors", None)
    if not isinstance(errors, dict) or not errors:
        return str(exc)
    return "; ".join(f"{host}: {getattr(err, 'strerror', None) or err}" for host, err in errors.items())
