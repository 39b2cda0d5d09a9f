"""Security and topology settings reach every client constructor (issue 15): Kafka SASL/TLS
(aiokafka's consumer, producer and admin client, faust's broker connection), Cassandra
authentication/TLS/local DC and the keyspace's replication, Redis credentials/TLS.

The real client classes are built (none connects): what each holds is what it would use."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from typing import Any, cast

import aiokafka
import aiokafka.admin
import pytest
import trustme

from app.connections import (
    cassandra_cluster_options,
    kafka_client_options,
    kafka_security_options,
    keyspace_replication,
    redis_client_options,
)
from app.runtime.app import faust_credentials
from app.settings import Settings, SettingsError
from app.stores.schema import create_keyspace_cql


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, and a client certificate + key it signed, as PEM files."""
    where = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    client = ca.issue_cert("projector-client")
    ca.cert_pem.write_to_path(str(where / "ca.pem"))
    client.cert_chain_pems[0].write_to_path(str(where / "client.pem"))
    client.private_key_pem.write_to_path(str(where / "client.key"))
    return {name: str(where / f"{name}.pem") for name in ("ca", "client")} | {
        "key": str(where / "client.key")
    }


A_FILE = __file__  # any readable file, where a test needs one that exists


def sasl_ssl(pki: dict[str, str], mechanism: str = "SCRAM-SHA-512") -> Settings:
    return Settings.from_env(
        {
            "PROJECTOR_KAFKA_BOOTSTRAP": "k1:9093,k2:9093",
            "PROJECTOR_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "PROJECTOR_KAFKA_SASL_MECHANISM": mechanism,
            "PROJECTOR_KAFKA_SASL_USERNAME": "projector",
            "PROJECTOR_KAFKA_SASL_PASSWORD": "kafka-secret",
            "PROJECTOR_KAFKA_SSL_CAFILE": pki["ca"],
            "PROJECTOR_KAFKA_SSL_CERTFILE": pki["client"],
            "PROJECTOR_KAFKA_SSL_KEYFILE": pki["key"],
        }
    )


def _client_of(kafka_object: Any) -> Any:
    # aiokafka's AIOKafkaClient, what every connection is made with (the producer names it `client`).
    return getattr(kafka_object, "_client", None) or kafka_object.client


# -- Kafka ----------------------------------------------------------------------------------------


async def test_plaintext_by_default_on_every_aiokafka_client() -> None:
    options = kafka_client_options(Settings().kafka)
    assert options == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "PLAINTEXT"}
    consumer = aiokafka.AIOKafkaConsumer(**options)
    assert _client_of(consumer)._security_protocol == "PLAINTEXT"
    assert faust_credentials(Settings().kafka) is None


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_sasl_ssl_reaches_the_consumer_producer_and_admin_client(
    pki: dict[str, str], mechanism: str
) -> None:
    settings = sasl_ssl(pki, mechanism)
    options = kafka_client_options(settings.kafka)
    clients = [
        aiokafka.AIOKafkaConsumer(**options),
        aiokafka.AIOKafkaProducer(**options),
        aiokafka.admin.AIOKafkaAdminClient(**options),
    ]
    try:
        for kafka_object in clients:
            client = _client_of(kafka_object)
            assert client._bootstrap_servers == "k1:9093,k2:9093"
            assert client._security_protocol == "SASL_SSL"
            assert client._sasl_mechanism == mechanism
            assert client._sasl_plain_username == "projector"
            assert client._sasl_plain_password == "kafka-secret"
            context: ssl.SSLContext = client._ssl_context
            assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
            # The CA file is loaded (one CA, not the system's store) ...
            assert [c["subject"] for c in context.get_ca_certs()] == [
                c["subject"] for c in ssl.create_default_context(cafile=pki["ca"]).get_ca_certs()
            ]
    finally:
        for kafka_object in clients[:2]:
            await kafka_object.stop()  # nothing started: only releases what the constructor made


async def test_tls_only_and_sasl_plaintext(pki: dict[str, str]) -> None:
    tls = Settings.build(kafka_security_protocol="SSL", kafka_ssl_cafile=pki["ca"])
    options = kafka_security_options(tls.kafka)
    assert options["security_protocol"] == "SSL" and isinstance(options["ssl_context"], ssl.SSLContext)
    assert "sasl_mechanism" not in options
    sasl = Settings.build(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="u",
        kafka_sasl_password="p",
    )
    consumer = aiokafka.AIOKafkaConsumer(**kafka_client_options(sasl.kafka))
    assert _client_of(consumer)._security_protocol == "SASL_PLAINTEXT"
    assert _client_of(consumer)._ssl_context is None


@pytest.mark.parametrize("protocol", ["SSL", "SASL_SSL", "SASL_PLAINTEXT"])
def test_faust_gets_the_same_options_through_its_credentials(pki: dict[str, str], protocol: str) -> None:
    """faust's aiokafka driver turns ``broker_credentials`` into every consumer's and producer's
    options (``credentials_to_aiokafka_auth``): they equal what the aiokafka clients get."""
    import faust
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    env = {"PROJECTOR_KAFKA_SECURITY_PROTOCOL": protocol}
    if protocol.startswith("SASL"):
        env |= {
            "PROJECTOR_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
            "PROJECTOR_KAFKA_SASL_USERNAME": "projector",
            "PROJECTOR_KAFKA_SASL_PASSWORD": "kafka-secret",
        }
    if protocol.endswith("SSL"):
        env |= {"PROJECTOR_KAFKA_SSL_CAFILE": pki["ca"]}
    settings = Settings.from_env(env)
    app = faust.App(
        "creds-test", broker="kafka://127.0.0.1:9092", broker_credentials=faust_credentials(settings.kafka)
    )
    auth = credentials_to_aiokafka_auth(app.conf.broker_credentials, app.conf.ssl_context)
    ours = kafka_security_options(settings.kafka)
    assert auth["security_protocol"] == ours["security_protocol"] == protocol
    for key in ("sasl_mechanism", "sasl_plain_username", "sasl_plain_password"):
        assert auth.get(key) == ours.get(key)
    assert isinstance(auth.get("ssl_context"), ssl.SSLContext) is protocol.endswith("SSL")


class _Refused(Exception):
    """Raised by the capturing clients' start(): the test needs the constructor, not a server."""


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Each aiokafka client class replaced by a subclass that records its keyword arguments,
    builds the real object, and refuses to start."""
    seen: list[dict[str, Any]] = []

    def capturing(real: type) -> type:
        class Capturing(real):  # type: ignore[misc]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                seen.append(kwargs)
                super().__init__(*args, **kwargs)

            async def start(self) -> None:
                raise _Refused

        return Capturing

    monkeypatch.setattr(aiokafka, "AIOKafkaConsumer", capturing(aiokafka.AIOKafkaConsumer))
    monkeypatch.setattr(aiokafka, "AIOKafkaProducer", capturing(aiokafka.AIOKafkaProducer))
    monkeypatch.setattr(aiokafka.admin, "AIOKafkaAdminClient", capturing(aiokafka.admin.AIOKafkaAdminClient))
    yield seen


def _secured(kwargs: dict[str, Any]) -> bool:
    return (
        kwargs.get("security_protocol") == "SASL_SSL"
        and kwargs.get("sasl_plain_password") == "kafka-secret"
        and isinstance(kwargs.get("ssl_context"), ssl.SSLContext)
    )


async def test_bootstrap_simulate_and_rebuild_build_their_kafka_clients_with_the_settings(
    pki: dict[str, str], captured: list[dict[str, Any]]
) -> None:
    from app.cli.bootstrap import KafkaUnavailable, ensure_topics
    from app.cli.rebuild import worker_config
    from app.rebuild.by_replay import rebuild_by_replay
    from app.simulate.drive import SimulateError, _open_producer
    from app.stores.memory_messages import InMemoryMessageStore
    from app.stores.memory_projection import InMemoryProjectionStore

    settings = sasl_ssl(pki)
    with pytest.raises((KafkaUnavailable, _Refused)):
        await ensure_topics(settings.kafka, settings.topics, ["t"], timeout_s=1)
    with pytest.raises((SimulateError, _Refused)):
        await _open_producer(settings.kafka, "t", 1.0)
    with pytest.raises(_Refused):
        await rebuild_by_replay(
            bootstrap=settings.kafka.kafka_bootstrap,
            topic="t",
            partitions=1,
            config=worker_config(settings),
            messages=InMemoryMessageStore(),
            target=InMemoryProjectionStore(),
            kafka_options=kafka_security_options(settings.kafka),
        )
    assert len(captured) == 3
    assert all(_secured(kwargs) for kwargs in captured), captured


async def test_the_sdk_follower_passes_security_options_through(pki: dict[str, str]) -> None:
    from app.sdk.kafka import SessionDeltaFollower

    settings = sasl_ssl(pki)
    follower = SessionDeltaFollower(
        None,  # type: ignore[arg-type]  # the list is not used before start()
        settings.kafka.kafka_bootstrap,
        ["session-delta"],
        **kafka_security_options(settings.kafka),
    )
    assert _client_of(follower.consumer)._security_protocol == "SASL_SSL"
    assert _client_of(follower.consumer)._sasl_plain_username == "projector"


# -- Cassandra ------------------------------------------------------------------------------------


def test_cassandra_auth_tls_and_local_dc_reach_the_cluster(pki: dict[str, str]) -> None:
    from cassandra.cluster import EXEC_PROFILE_DEFAULT

    from app.stores.cassandra_session import build_cluster

    settings = Settings.build(
        cassandra_username="projector",
        cassandra_password="cql-secret",
        cassandra_ssl=True,
        cassandra_ssl_cafile=pki["ca"],
        cassandra_ssl_certfile=pki["client"],
        cassandra_ssl_keyfile=pki["key"],
        cassandra_local_dc="eu-west",
    )
    cluster = build_cluster(settings.cassandra)
    try:
        auth = cluster.auth_provider.new_authenticator("127.0.0.1")
        assert (auth.username, auth.password) == ("projector", "cql-secret")
        assert cluster.ssl_context.verify_mode == ssl.CERT_REQUIRED
        policy = cluster.profile_manager.profiles[EXEC_PROFILE_DEFAULT].load_balancing_policy
        assert policy._child_policy.local_dc == "eu-west"
    finally:
        cluster.shutdown()
    plain = build_cluster(Settings().cassandra)
    try:
        assert plain.auth_provider is None and plain.ssl_context is None
    finally:
        plain.shutdown()
    assert cassandra_cluster_options(Settings().cassandra) == {}


def test_the_keyspace_is_created_per_data_center_when_one_is_named() -> None:
    assert keyspace_replication(Settings.build(cassandra_replication_factor=3).cassandra) is None
    assert "'class': 'SimpleStrategy', 'replication_factor': 3" in create_keyspace_cql("ks", 3, None)
    local = Settings.build(cassandra_local_dc="dc1", cassandra_replication_factor=3)
    assert keyspace_replication(local.cassandra) == {"dc1": 3}
    two = Settings.from_env(
        {"PROJECTOR_CASSANDRA_LOCAL_DC": "dc2", "PROJECTOR_CASSANDRA_REPLICATION_PER_DC": "dc1:3, dc2:5"}
    )
    assert keyspace_replication(two.cassandra) == {"dc1": 3, "dc2": 5}
    cql = create_keyspace_cql("ks", 1, keyspace_replication(two.cassandra))
    assert "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 5}" in cql


# -- Redis ----------------------------------------------------------------------------------------


async def test_redis_credentials_and_tls_reach_the_store_client(pki: dict[str, str]) -> None:
    import redis.asyncio as redis

    from app.stores.redis_projection import RedisProjectionStore

    settings = Settings.build(
        redis_url="rediss://cache.internal:6380/0",
        redis_username="projector",
        redis_password="redis-secret",
        redis_ssl_cafile=pki["ca"],
        redis_ssl_certfile=pki["client"],
        redis_ssl_keyfile=pki["key"],
    )
    store = RedisProjectionStore.from_settings(settings.redis)
    try:
        pool = cast(redis.Redis, store.client).connection_pool  # one server's URL: not a cluster
        assert issubclass(pool.connection_class, redis.SSLConnection)
        kwargs = pool.connection_kwargs
        assert (kwargs["username"], kwargs["password"]) == ("projector", "redis-secret")
        assert kwargs["ssl_ca_certs"] == pki["ca"]
        assert (kwargs["ssl_certfile"], kwargs["ssl_keyfile"]) == (pki["client"], pki["key"])
    finally:
        await store.aclose()
    assert redis_client_options(Settings().redis) == {}


# -- validation -----------------------------------------------------------------------------------


def _problems(env: dict[str, str]) -> str:
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(env)
    return str(caught.value)


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        (
            {"PROJECTOR_KAFKA_SECURITY_PROTOCOL": "TLS"},
            "PROJECTOR_KAFKA_SECURITY_PROTOCOL: 'TLS' is not one of",
        ),
        (
            {"PROJECTOR_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "PROJECTOR_KAFKA_SASL_MECHANISM": "GSSAPI"},
            "PROJECTOR_KAFKA_SASL_MECHANISM: 'GSSAPI' is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
        ),
        (
            {
                "PROJECTOR_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "PROJECTOR_KAFKA_SASL_MECHANISM": "PLAIN",
            },
            "PROJECTOR_KAFKA_SASL_USERNAME/PROJECTOR_KAFKA_SASL_PASSWORD: both needed",
        ),
        (
            {"PROJECTOR_KAFKA_SASL_USERNAME": "u"},
            "PROJECTOR_KAFKA_SASL_*: set, but PROJECTOR_KAFKA_SECURITY_PROTOCOL",
        ),
        (
            {"PROJECTOR_KAFKA_SSL_CAFILE": A_FILE},
            "PROJECTOR_KAFKA_SSL_CAFILE: TLS files given, but TLS is off",
        ),
        (
            {"PROJECTOR_KAFKA_SECURITY_PROTOCOL": "SSL", "PROJECTOR_KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"},
            "PROJECTOR_KAFKA_SSL_CAFILE: '/nonexistent/ca.pem' is not a readable file",
        ),
        (
            {"PROJECTOR_KAFKA_SECURITY_PROTOCOL": "SSL", "PROJECTOR_KAFKA_SSL_CERTFILE": A_FILE},
            "PROJECTOR_KAFKA_SSL_CERTFILE/PROJECTOR_KAFKA_SSL_KEYFILE: a client certificate needs both",
        ),
        (
            {"PROJECTOR_CASSANDRA_USERNAME": "u"},
            "PROJECTOR_CASSANDRA_USERNAME/PROJECTOR_CASSANDRA_PASSWORD: give both",
        ),
        ({"PROJECTOR_CASSANDRA_SSL_CAFILE": A_FILE}, "needs PROJECTOR_CASSANDRA_SSL=true"),
        (
            {"PROJECTOR_CASSANDRA_LOCAL_DC": "dc 1"},
            "PROJECTOR_CASSANDRA_LOCAL_DC: 'dc 1' is not a data center name",
        ),
        ({"PROJECTOR_CASSANDRA_REPLICATION_PER_DC": "dc1:3"}, "needs PROJECTOR_CASSANDRA_LOCAL_DC"),
        (
            {"PROJECTOR_CASSANDRA_REPLICATION_PER_DC": "dc1=3,dc2:0", "PROJECTOR_CASSANDRA_LOCAL_DC": "dc1"},
            "PROJECTOR_CASSANDRA_REPLICATION_PER_DC: ['dc1=3', 'dc2:0'] are not DC:RF",
        ),
        (
            {"PROJECTOR_CASSANDRA_REPLICATION_PER_DC": "dc1:3", "PROJECTOR_CASSANDRA_LOCAL_DC": "dc9"},
            "PROJECTOR_CASSANDRA_LOCAL_DC: 'dc9' holds no replica",
        ),
        ({"PROJECTOR_REDIS_SSL_CAFILE": A_FILE}, "needs a rediss:// URL"),
        (
            {"PROJECTOR_REDIS_URL": "redis://:pw@h:6379/0", "PROJECTOR_REDIS_PASSWORD": "x"},
            "PROJECTOR_REDIS_PASSWORD: the PROJECTOR_REDIS_URL carries credentials too",
        ),
        ({"PROJECTOR_REDIS_USERNAME": "u"}, "PROJECTOR_REDIS_USERNAME: needs PROJECTOR_REDIS_PASSWORD"),
    ],
)
def test_inconsistent_security_settings_are_refused(env: dict[str, str], fragment: str) -> None:
    assert fragment in _problems(env)


def test_passwords_never_show_in_repr(pki: dict[str, str]) -> None:
    settings = sasl_ssl(pki).replace(
        cassandra_username="u", cassandra_password="cql-secret", redis_password="redis-secret"
    )
    text = repr(settings)
    assert "projector" in text  # the user names are there, the passwords are not
    assert "kafka-secret" not in text and "cql-secret" not in text and "redis-secret" not in text
