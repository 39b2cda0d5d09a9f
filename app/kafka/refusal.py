"""Why a Kafka client could not start, in one line: the broker refused its SASL login or its TLS
certificate is not trusted here (the setting to fix is named), else "cannot reach" with the hint
of app/connections.py.

aiokafka's bootstrap says only "Unable to bootstrap from [...]": the reason per broker goes to its
log, which the callers silence (one line of their own, not one per attempt). So on that failure
:func:`kafka_refusal` opens one connection through the same TLS context and SASL options and reads
its error. Kept out of app/connections.py, which app.api and app.stores import (no aiokafka there).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import KafkaError

from app.connections import kafka_error_text, kafka_hosts, quiet_logger, tls_refusal, unreachable_hint


async def kafka_unreachable(bootstrap: str, security: Mapping[str, Any], exc: BaseException) -> str:
    """The one line for a Kafka client that could not start (``exc``): the broker's refusal of
    the credentials or the CA when that is why (:func:`kafka_refusal`), else "cannot reach" with
    the hint. ``security`` is app.connections.kafka_security_options of the settings."""
    refusal = await kafka_refusal(bootstrap, security)
    if refusal is not None:
        return refusal
    return f"cannot reach Kafka at {bootstrap} ({kafka_error_text(exc)})" + unreachable_hint(
        kafka_hosts(bootstrap)
    )


async def kafka_refusal(bootstrap: str, security: Mapping[str, Any], timeout_s: float = 5.0) -> str | None:
    """Why a broker that answers refuses this client's TLS or SASL login, in one line naming the
    setting to fix; None when it does not (PLAINTEXT, nothing listening, a timeout, or a
    connection that works).

    aiokafka's bootstrap says only "Unable to bootstrap" (the reason per broker goes to its log,
    which the callers silence): one connection is opened here, through the same TLS context and
    SASL options, and its error is read."""
    protocol = security.get("security_protocol", "PLAINTEXT")
    if protocol == "PLAINTEXT":
        return None
    for address in [part.strip() for part in bootstrap.split(",") if part.strip()]:
        host, _, port = address.rpartition(":")
        try:
            with quiet_logger("aiokafka"):
                conn = await asyncio.wait_for(
                    create_conn(
                        host.strip("[]"), int(port), request_timeout_ms=int(timeout_s * 1000), **security
                    ),
                    timeout_s,
                )
        except ssl.SSLCertVerificationError as exc:
            return tls_refusal("Kafka", address, exc, "PROJECTOR_KAFKA_SSL_CAFILE")
        except ssl.SSLError as exc:
            return (
                f"TLS with Kafka at {address} failed ({exc.reason or exc}): check that its listener speaks "
                f"{protocol} (PROJECTOR_KAFKA_SECURITY_PROTOCOL) and the PROJECTOR_KAFKA_SSL_* files"
            )
        except KafkaError as exc:
            if "sasl" not in type(exc).__name__.lower():
                continue  # not a login problem: the caller's "cannot reach" stands
            detail = str(exc).partition(": ")[2] or str(exc)
            return (
                f"Kafka at {address} refused the SASL login of {security.get('sasl_plain_username')!r} "
                f"({security.get('sasl_mechanism')}): {detail}; check PROJECTOR_KAFKA_SASL_USERNAME, "
                "PROJECTOR_KAFKA_SASL_PASSWORD and PROJECTOR_KAFKA_SASL_MECHANISM"
            )
        except (OSError, TimeoutError, ValueError):
            continue
        conn.close()
    return None
