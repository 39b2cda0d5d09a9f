"""`PROJECTOR_REDIS_URL`: which Redis the projection store talks to, parsed and checked before
anything connects (standard library only: app.settings validates with it).

One server::

    redis://[[user]:password@]host[:port][/db][?option=value&...]
    rediss://...                                   (TLS)
    unix:///path/to/redis.sock[?db=N]

A Redis Cluster (the listed nodes are only where the client starts: it discovers the others and
follows slot moves and failovers itself; database 0 only, as cluster mode allows)::

    redis+cluster://[[user]:password@]host:port[,host:port...][?option=value&...]
    rediss+cluster://...                           (TLS)

Options are the connection options in :data:`OPTIONS`; anything else is an error. In particular
``?cluster=true`` is refused with a pointer to ``redis+cluster://``: a plain client would pass the
unknown option along and talk to one node as if it were the whole store (issue 15).
User names and passwords are percent-encoded in the URL (``%40`` for ``@``, ``%2C`` for ``,``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import parse_qsl, quote, unquote

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_NODE_RE = re.compile(r"(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>\d{1,5})")
_HOST_RE = re.compile(r"(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d{1,5}))?")
_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value <= 3600:  # also refuses nan and inf
        raise ValueError("expected seconds in (0, 3600]")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text, 10)
    if value < 0:
        raise ValueError("expected an integer >= 0")
    return value


def _positive_int(text: str) -> int:
    value = int(text, 10)
    if value < 1:
        raise ValueError("expected an integer >= 1")
    return value


def parse_bool(text: str) -> bool:
    """A boolean word (true/false, 1/0, yes/no, on/off; any case): the URL's options and the
    PROJECTOR_* settings read booleans alike. ValueError otherwise."""
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected a boolean (true/false, 1/0, yes/no, on/off)")


def _cert_reqs(text: str) -> str:
    if text not in ("none", "optional", "required"):
        raise ValueError("expected none, optional or required")
    return text


# Option -> its parser (value for redis-py's connection keyword of the same name). The TLS ones
# only with rediss:// and rediss+cluster://.
OPTIONS: Mapping[str, Callable[[str], object]] = MappingProxyType(
    {
        "socket_timeout": _positive_float,
        "socket_connect_timeout": _positive_float,
        "socket_keepalive": parse_bool,
        "health_check_interval": _non_negative_int,
        "max_connections": _positive_int,
        "client_name": str,
        "ssl_cert_reqs": _cert_reqs,
        "ssl_ca_certs": str,
        "ssl_certfile": str,
        "ssl_keyfile": str,
        "ssl_check_hostname": parse_bool,
    }
)
_TLS_ONLY = frozenset(name for name in OPTIONS if name.startswith("ssl_"))


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A parsed `PROJECTOR_REDIS_URL`. `nodes` has one entry for a single server (none for a
    unix socket) and the startup nodes of a cluster."""

    cluster: bool
    tls: bool
    nodes: tuple[tuple[str, int], ...]
    unix_path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    options: Mapping[str, object] = field(default_factory=dict)

    def describe(self) -> str:
        """For logs and errors: the URL without its password."""
        scheme = ("rediss" if self.tls else "redis") + ("+cluster" if self.cluster else "")
        if self.unix_path is not None:
            return f"unix://{self.unix_path}" + (f"?db={self.db}" if self.db else "")
        auth = f"{quote(self.username or '', safe='')}:***@" if self.password or self.username else ""
        where = ",".join(f"{host}:{port}" for host, port in self.nodes)
        return f"{scheme}://{auth}{where}" + (f"/{self.db}" if self.db else "")


def parse_redis_url(url: str) -> RedisTarget:
    """The target `url` names; ValueError with what is wrong (and no password in it)."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep or scheme not in _SCHEMES:
        raise ValueError(
            "must start with redis://, rediss://, unix:// (one server) or redis+cluster://, "
            "rediss+cluster:// (a Redis Cluster)"
        )
    if any(ch.isspace() for ch in rest):
        raise ValueError("contains white space")
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise ValueError("has a #fragment, which means nothing here")
    rest, _, query = rest.partition("?")
    options, db_option = _options(query, tls=scheme.startswith("rediss"), cluster=scheme.endswith("+cluster"))
    if scheme == "unix":
        if not rest.startswith("/") or rest == "/":
            raise ValueError("unix:// needs an absolute socket path (unix:///run/redis.sock)")
        return RedisTarget(False, False, (), unix_path=unquote(rest), db=db_option or 0, options=options)
    netloc, slash, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")  # no "@": userinfo is ""
    username = password = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    db = db_option or 0
    if slash and path:
        if not path.isdigit():
            raise ValueError(f"the path /{path} must be a database number")
        if db_option is not None:
            raise ValueError("gives the database twice (path and ?db=)")
        db = int(path)
    cluster = scheme.endswith("+cluster")
    if cluster:
        if db:
            raise ValueError("a Redis Cluster has database 0 only")
        nodes = tuple(_node(part) for part in hosts.split(","))
    else:
        if "," in hosts:
            raise ValueError("lists several hosts: for a Redis Cluster use redis+cluster://host:port,...")
        m = _HOST_RE.fullmatch(hosts)
        if m is None:
            raise ValueError(f"{hosts!r} is not HOST[:PORT]")
        nodes = ((m["host"].strip("[]"), _port(m["port"] or "6379")),)
    return RedisTarget(
        cluster=cluster,
        tls=scheme.startswith("rediss"),
        nodes=nodes,
        db=db,
        username=username,
        password=password,
        options=options,
    )


def _node(text: str) -> tuple[str, int]:
    m = _NODE_RE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"cluster node {text.strip()!r} is not HOST:PORT")
    return m["host"].strip("[]"), _port(m["port"])


def _port(text: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is not a TCP port (1..65535)")
    return port


def _options(query: str, *, tls: bool, cluster: bool) -> tuple[dict[str, object], int | None]:
    options: dict[str, object] = {}
    db: int | None = None
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"the query ?{query} is not name=value&...") from None
    for name, value in pairs:
        if name in options or (name == "db" and db is not None):
            raise ValueError(f"option {name} is given twice")
        if name == "cluster":
            raise ValueError(
                "?cluster= is not an option: name a Redis Cluster with the scheme, "
                "redis+cluster://host:port[,host:port...]"
            )
        if name == "db":
            if cluster:
                raise ValueError("a Redis Cluster has database 0 only")
            try:
                db = _non_negative_int(value)
            except ValueError as exc:
                raise ValueError(f"option db={value!r}: {exc}") from None
            continue
        parser = OPTIONS.get(name)
        if parser is None:
            known = ", ".join(["db", *OPTIONS])
            raise ValueError(f"unknown option {name!r} (known: {known})")
        if name in _TLS_ONLY and not tls:
            raise ValueError(f"option {name} needs TLS (rediss:// or rediss+cluster://)")
        try:
            options[name] = parser(value)
        except ValueError as exc:
            raise ValueError(f"option {name}={value!r}: {exc}") from None
    return options, db
