import { test } from "node:test";
import assert from "node:assert/strict";

import { LiveSessionList, LiveStream, SessionsClient, SseParser, type MemberNotice } from "../src/index.js";
import { FakeStream, fakeFetch, sse, tick } from "./fakes.js";

const ME = "18446744073709551615";
const CONV = "00000000-0000-0000-0000-00000000000a";

test("the SSE parser joins events across chunks and line endings", () => {
  const parser = new SseParser();
  const bytes = new TextEncoder().encode("retry: 2000\r\n\r\nid: 7\r\nevent: hello\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n: comment\n\nevent: heartbeat\ndata: {}\n\n");
  const events = [];
  for (let i = 0; i < bytes.length; i += 5) events.push(...parser.push(bytes.slice(i, i + 5)));
  assert.deepEqual(events, [
    { event: "hello", data: "{\"a\":\n1}", id: "7" },
    { event: "heartbeat", data: "{}", id: "7" },
  ]);
});

function rowAt(unread: number): Record<string, unknown> {
  return {
    user_id: ME, conversation_id: CONV, listed: true, membership: "active", pinned: false, pin_rank: null, archived: false, muted: false,
    last_activity_id: "0".repeat(31) + "1", latest_conversation_seq: 1, last_message_id: "m1", unread_count: unread, unread_exact: true,
    mention_count: 0, mention_first_conversation_seq: null, read_conversation_seq: 0, hidden_before_conversation_seq: 0,
    deleted_before_conversation_seq: 0, joined_at_conversation_seq: 0, left_at_conversation_seq: null, projection_mailbox_seq: 5,
  };
}

test("the stream pulls on hello, applies frames by the rule, and resumes with Last-Event-ID", async () => {
  const streams: FakeStream[] = [];
  const fetch = fakeFetch((call) => {
    if (call.path.startsWith("/v1/sessions")) {
      return { status: 200, json: { items: new URL(call.url).searchParams.get("folder") === "main" ? [rowAt(1)] : [], next_cursor: null, snapshot_revision: 1, projection_complete: true, projection_mailbox_seq: 5, folder: "main", filled_from_state: false, truncated: false } };
    }
    if (call.path === "/v1/badge") return { status: 200, json: { total_unread: 1, total_mention: 0, muted_unread: 0, projection_mailbox_seq: 5 } };
    if (call.path === "/v1/stream") {
      const s = new FakeStream();
      streams.push(s);
      return { status: 200, stream: s };
    }
    return { status: 404, json: { error: { status: 404, code: "not_found", message: "Not Found" } } };
  });
  const client = new SessionsClient({ baseUrl: "http://api", token: "tok", fetch });
  const list = new LiveSessionList(client, ME);
  const notices: MemberNotice[] = [];
  const stream = new LiveStream(list, { onNotice: (n) => notices.push(n), reconnectMs: 1 });
  const stop = new AbortController();
  const running = stream.run({ signal: stop.signal });
  await stream.until(() => streams.length === 1);
  const hello = (status: string, v: number) => ({ type: "hello", user_id: ME, status, reason: null, projection_mailbox_seq: v, badge: { total_unread: 1, total_mention: 0, muted_unread: 0, projection_mailbox_seq: v }, replayed: 0, heartbeat_ms: 1000 });
  streams[0]!.write(sse("hello", hello("fresh", 5), 5));
  await stream.until(() => stream.synced);
  assert.equal(list.view.row(CONV)?.unread_count, 1);
  streams[0]!.write(sse("SESSION_DELTA", { type: "SESSION_DELTA", user_id: ME, projection_mailbox_seq: 6, prev_projection_mailbox_seq: 5, conversations: [rowAt(3)] }, 6));
  streams[0]!.write(sse("BADGE_UPDATE", { type: "BADGE_UPDATE", user_id: ME, total_unread: 3, total_mention: 0, muted_unread: 0, projection_mailbox_seq: 6, prev_projection_mailbox_seq: 5 }));
  const notice = { type: "MEMBER_NOTICE", user_id: ME, conversation_id: CONV, kind: 24, conversation_seq: 2, projection_mailbox_seq: 6 };
  streams[0]!.write(sse("MEMBER_NOTICE", notice));
  streams[0]!.write(sse("MEMBER_NOTICE", notice)); // at least once: reacted to once
  await stream.until(() => stream.stats.notices === 2);
  assert.equal(list.view.row(CONV)?.unread_count, 3);
  assert.equal(list.view.badge?.total_unread, 3);
  assert.equal(notices.length, 1);
  const pulls = fetch.calls.filter((c) => c.path.startsWith("/v1/sessions")).length;

  stream.drop(); // the network drops: reconnect with the version held
  await stream.until(() => streams.length === 2);
  const resume = fetch.calls.filter((c) => c.path === "/v1/stream")[1]!;
  assert.equal(resume.headers["Last-Event-ID"], "6");
  assert.equal(resume.headers["Authorization"], "Bearer tok");
  streams[1]!.write(sse("hello", hello("resumed", 7), 6));
  streams[1]!.write(sse("SESSION_DELTA", { type: "SESSION_DELTA", user_id: ME, projection_mailbox_seq: 7, prev_projection_mailbox_seq: 6, conversations: [rowAt(0)] }, 7));
  await stream.until(() => list.view.version === 7);
  assert.equal(list.view.row(CONV)?.unread_count, 0);
  assert.equal(fetch.calls.filter((c) => c.path.startsWith("/v1/sessions")).length, pulls, "a resume pulls nothing");
  assert.deepEqual(stream.stats.hellos, { fresh: 1, resumed: 1 });

  // A gap (a frame lost) re-pulls instead of patching.
  streams[1]!.write(sse("SESSION_DELTA", { type: "SESSION_DELTA", user_id: ME, projection_mailbox_seq: 9, prev_projection_mailbox_seq: 8, conversations: [rowAt(9)] }, 9));
  await stream.until(() => stream.stats.gaps === 1);
  assert.ok(fetch.calls.filter((c) => c.path.startsWith("/v1/sessions")).length > pulls);
  assert.equal(list.view.row(CONV)?.unread_count, 1, "the re-pulled row, not the frame after the gap");
  stop.abort();
  await running;
  await tick();
});
