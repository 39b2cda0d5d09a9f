"""The live push gateway (issue 16, docs/contract.md §9): frames from the topics to connected devices.

* :mod:`app.gateway.hub` — who is connected, per-connection bounded buffers, per-user recent
  frames for resume, heartbeats. asyncio and the stdlib only (the API imports it).
* :mod:`app.gateway.service` — the gateway the API's ``/v1/stream`` route talks to (hub,
  presence, partition ownership, background loops). No Kafka.
* :mod:`app.gateway.presence` — who has a live stream on any instance (Redis, with a TTL).
* :mod:`app.gateway.kafka_frames` — the Kafka adapter: reads the session-delta and badge topics
  and publishes each frame to the hub (aiokafka lives here, never in ``app/api``).
* :mod:`app.gateway.push` — offline badge pushes to topic ``push`` (a consumer group over the
  badge topic: exactly one producer per user).
* :mod:`app.gateway.wiring` — builds all of it from the settings for ``projector api``.

The protocol and the design are in docs/gateway.md.
"""
