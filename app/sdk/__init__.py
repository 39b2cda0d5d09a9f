"""Python client for the query API: page walks with bounded restarts, a live list kept current by
SESSION_DELTA frames (app.domain.client's rule), and a Kafka follower for the frame topics.

    async with SessionsClient("http://127.0.0.1:8080", token) as api:
        live = LiveSessionList(api, user_id)
        async with SessionDeltaFollower(live, "127.0.0.1:9092", ["session-delta", "badge"]) as follow:
            ...                      # follow.poll() / follow.run(stop) keep live.main() current
"""

from app.sdk.client import ClientError, Page, SessionsClient, TooManyRestarts, Walk
from app.sdk.live import LiveSessionList

__all__ = ["ClientError", "LiveSessionList", "Page", "SessionsClient", "TooManyRestarts", "Walk"]
