"""Python client for the query API: page walks with bounded restarts, a live list kept current by
SESSION_DELTA frames (app.domain.client's rule) over the gateway's live stream (what a device
runs), and a Kafka follower of the frame topics (for back-end tools).

    async with SessionsClient("http://127.0.0.1:8080", token) as api:
        live = LiveSessionList(api, user_id)
        stream = LiveStream(live, on_notice=members_to(registry))   # GET /v1/stream (SSE)
        await stream.run(stop)           # live.main(), live.view.badge stay current

Ids arrive as decimal strings (docs/contract.md §9) and come out as ints.
"""

from app.sdk.client import ClientError, Page, ReconcileAnswer, SessionsClient, TooManyRestarts, Walk
from app.sdk.live import LiveSessionList
from app.sdk.stream import LiveStream, members_to

__all__ = [
    "ClientError",
    "LiveSessionList",
    "LiveStream",
    "Page",
    "ReconcileAnswer",
    "SessionsClient",
    "TooManyRestarts",
    "Walk",
    "members_to",
]
