"""The worker's MEMBER_NOTICE frame through the gateway's hub (docs/contract.md §9, issue 16
part 2): its place in the user's resume log, no version chain, ids as strings to clients."""

from __future__ import annotations

import orjson

from app.domain.notices import MemberNotice
from app.gateway.hub import MEMBER_NOTICE, FrameHub, entry_of
from tests.support.builders import CONV_A

ALICE = 11982011376358104761


def test_the_gateway_takes_the_worker_s_notice_frame_and_sends_ids_as_strings() -> None:
    frame = MemberNotice(ALICE, CONV_A, 27, 41, 900).frame()
    user, entry = entry_of(frame)
    assert (user, entry.kind, entry.version, entry.prev) == (ALICE, MEMBER_NOTICE, 900, None)
    event = entry.event.decode()
    assert event.startswith("event: MEMBER_NOTICE\n") and "\nid:" not in event
    data = orjson.loads(event.split("data: ", 1)[1])
    assert data["user_id"] == str(ALICE) and data["kind"] == 27 and data["conversation_seq"] == 41
    hub = FrameHub()
    conn = hub.attach(ALICE)
    hub.start(conn, 800, None)
    assert hub.publish(frame, expected_user=ALICE) == 1
