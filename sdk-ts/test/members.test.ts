import { test } from "node:test";
import assert from "node:assert/strict";

import {
  MemberAccessDeniedError,
  MemberApiMissingError,
  MembersClient,
  RequestError,
  UnavailableError,
  isAbort,
  mergeJoinEvents,
} from "../src/index.js";
import { fakeFetch } from "./fakes.js";

const GROUP = "5f0c7d5e-0000-4000-8000-000000000001";
const BIG = "18446744073709551615";

function error(status: number, code: string, message = "") {
  return { status, json: { error: { status, code, message } } };
}

test("2001 and 2002 are access denials; nothing else is", async () => {
  for (const [answer, kind] of [
    [error(403, "2001"), MemberAccessDeniedError],
    [error(403, "2002"), MemberAccessDeniedError],
    [error(409, "conflict"), RequestError],
    [error(400, "bad_request"), RequestError],
    [error(503, "unavailable"), UnavailableError],
    [error(429, "rate_limited"), UnavailableError],
  ] as const) {
    const client = new MembersClient({ baseUrl: "http://api", token: "t", fetch: fakeFetch(() => answer) });
    await assert.rejects(client.page({ group: GROUP }), (e: unknown) => e instanceof kind && !(kind !== MemberAccessDeniedError && e instanceof MemberAccessDeniedError));
  }
});

test("a backend without the paging API answers a clear request error", async () => {
  const client = new MembersClient({ baseUrl: "http://old", token: "t", fetch: fakeFetch(() => error(404, "not_found", "Not Found")) });
  await assert.rejects(client.page({ group: GROUP }), (e: unknown) => e instanceof MemberApiMissingError && e instanceof RequestError && /members page/.test(e.message));
  await assert.rejects(client.presentation({ group: GROUP, memberRefs: ["1"] }), MemberApiMissingError);
});

test("the capability probe reads the API's description", async () => {
  const fetch = fakeFetch((call) => {
    assert.equal(call.path, "/openapi.json");
    return { status: 200, json: { paths: { "/api/v1/chats/members/page": { post: { operationId: "membersPage" } }, "/v1/stream": { get: { operationId: "stream" } } } } };
  });
  const client = new MembersClient({ baseUrl: "http://api", token: "t", fetch });
  assert.deepEqual(await client.probe(), { membersPage: true, presentation: false, readReceipts: false, liveStream: true });
  const none = new MembersClient({ baseUrl: "http://api", token: "t", fetch: fakeFetch(() => error(404, "not_found")) });
  assert.deepEqual(await none.probe(), { membersPage: false, presentation: false, readReceipts: false, liveStream: false });
});

test("pages keep u64 ids as strings and pass the opaque next reference back", async () => {
  const REF = "CiIBAAAAAAAAAAAAAAAAAAAAAQ"; // opaque to the client: handed back untouched
  const fetch = fakeFetch((call) => {
    const body = call.body as Record<string, unknown>;
    assert.equal(body["after_user_id"], undefined); // never the raw keyset position
    if (body["page_ref"] === undefined) {
      return {
        status: 200,
        json: {
          items: [{ user_id: BIG, role: "owner", state: "active", active: true, joined_at_conversation_seq: 4 }],
          has_more: true,
          next_page_ref: REF,
          self_role: "owner",
          capabilities: { invite: true, remove_members: "yes" },
          join_events: [{ event_ref: "join:4", joined_at_conversation_seq: 4, invitee_refs: [BIG] }],
        },
      };
    }
    assert.equal(body["page_ref"], REF);
    return {
      status: 200,
      json: {
        items: [], has_more: false, next_page_ref: null, self_role: "owner", capabilities: {},
        join_events: [{ event_ref: "join:4", joined_at_conversation_seq: 4, invitee_refs: ["5", BIG] }],
      },
    };
  });
  const client = new MembersClient({ baseUrl: "http://api", token: "t", fetch });
  const first = await client.page({ group: GROUP });
  assert.equal(first.items[0]?.memberRef, BIG);
  assert.equal(first.next, REF);
  // Only a true boolean grants an admin capability.
  assert.deepEqual(first.adminCapabilities, { invite: true, remove_members: false });
  const second = await client.page({ group: GROUP, after: first.next });
  assert.equal(second.next, null);
  // Join events of two pages merge into one event, invitees by memberRef.
  const merged = mergeJoinEvents(mergeJoinEvents(new Map(), first.joinEvents ?? []), second.joinEvents ?? []);
  assert.deepEqual(merged.get("join:4")?.invitees, [BIG, "5"]);
  await assert.rejects(client.page({ group: GROUP, limit: 101 }), RangeError);
});

test("read receipts page with a limit and the opaque reference; an unknown message is a request error", async () => {
  const fetch = fakeFetch((call) => {
    if (call.url.includes("/messages/99/")) return error(404, "unknown_message");
    const url = new URL(call.url);
    assert.equal(url.searchParams.get("limit"), "7");
    const more = url.searchParams.get("page_ref") === null;
    return {
      status: 200,
      json: {
        conversation_seq: 10, sender_id: "1", read_user_ids: more ? ["2"] : ["3"], unread_user_ids: [],
        read_count: 1, unread_count: 0, basic_only: true, self_role: "member",
        has_more: more, next_page_ref: more ? "R1" : null,
      },
    };
  });
  const client = new MembersClient({ baseUrl: "http://api", token: "t", fetch });
  const first = await client.readReceipts({ group: GROUP, conversationSeq: 10, basicOnly: true, limit: 7 });
  assert.equal(first.hasMore, true);
  assert.equal(first.next, "R1");
  const second = await client.readReceipts({ group: GROUP, conversationSeq: 10, basicOnly: true, limit: 7, pageRef: first.next ?? null });
  assert.deepEqual([second.readRefs, second.hasMore, second.next], [["3"], false, null]);
  await assert.rejects(client.readReceipts({ group: GROUP, conversationSeq: 99 }), RequestError);
  await assert.rejects(client.readReceipts({ group: GROUP, conversationSeq: 10, limit: 501 }), RangeError);
});

test("statistics are known only as two non-negative safe integers", async () => {
  const items = [
    { user_id: "1", record_count: 3, mention_count: 0 },
    { user_id: "2", record_count: -1, mention_count: 2 },
    { user_id: "3", record_count: 2 ** 53, mention_count: 1 },
    { user_id: "4", record_count: 1.5, mention_count: 1 },
    { user_id: "5" },
  ];
  const fetch = fakeFetch(() => ({ status: 200, json: { items, missing_user_ids: ["6"], stats_included: true, self_role: "member" } }));
  const client = new MembersClient({ baseUrl: "http://api", token: "t", fetch });
  const result = await client.presentation({ group: GROUP, memberRefs: ["1", "2", "3", "4", "5", "6"] });
  assert.deepEqual(result.items.map((m) => [m.memberRef, m.statsKnown, m.recordCount, m.mentionCount]), [
    ["1", true, 3, 0], ["2", false, null, null], ["3", false, null, null], ["4", false, null, null], ["5", false, null, null],
  ]);
  assert.deepEqual(result.missingRefs, ["6"]);
  assert.equal((fetch.calls[0]?.body as Record<string, unknown>)["include_stats"], true);
  await assert.rejects(client.presentation({ group: GROUP, memberRefs: Array.from({ length: 51 }, (_, i) => String(i)) }), RangeError);
});

test("every call takes an AbortSignal: the request gets it and an abort rejects with its reason", async () => {
  const fetch = fakeFetch(() => new Promise(() => undefined)); // never answers
  const client = new MembersClient({ baseUrl: "http://api", token: "t", fetch });
  const calls = [
    (signal: AbortSignal) => client.page({ group: GROUP, signal }),
    (signal: AbortSignal) => client.presentation({ group: GROUP, memberRefs: ["1"], signal }),
    (signal: AbortSignal) => client.readReceipts({ group: GROUP, conversationSeq: 8, basicOnly: true, signal }),
    (signal: AbortSignal) => client.probe({ signal }),
  ];
  for (const call of calls) {
    const controller = new AbortController();
    const pending = call(controller.signal);
    controller.abort();
    await assert.rejects(pending, (e: unknown) => isAbort(e));
    assert.equal(fetch.calls[fetch.calls.length - 1]?.signal, controller.signal);
  }
  const custom = new AbortController();
  const reason = { why: "the drawer closed" };
  const pendingCustom = client.page({ group: GROUP, signal: custom.signal });
  custom.abort(reason);
  await assert.rejects(pendingCustom, (e: unknown) => e === reason && isAbort(e, custom.signal));
  await assert.rejects(client.page({ group: GROUP, signal: AbortSignal.timeout(5) }), (e: unknown) => isAbort(e));
  const aborted = AbortSignal.abort();
  const before = fetch.calls.length;
  await assert.rejects(client.page({ group: GROUP, signal: aborted }), (e: unknown) => isAbort(e));
  assert.equal(fetch.calls.length, before, "an already aborted call sends nothing");
});

test("read receipts: basicOnly asks for ids and counts only", async () => {
  const fetch = fakeFetch(() => ({ status: 200, json: { conversation_seq: 8, sender_id: "20", read_user_ids: ["5", "21"], unread_user_ids: ["22"], read_count: 2, unread_count: 1, basic_only: true, self_role: "member" } }));
  const client = new MembersClient({ baseUrl: "http://api", token: "t", fetch });
  const receipts = await client.readReceipts({ group: GROUP, conversationSeq: 8, basicOnly: true });
  assert.equal(fetch.calls[0]?.path, `/api/v1/chats/${GROUP}/messages/8/readers?basic_only=true`);
  assert.deepEqual([receipts.readRefs, receipts.unreadRefs, receipts.senderId, receipts.read], [["5", "21"], ["22"], "20", undefined]);
});

test("profiles come in batches of 1..50 as the store's ProfileSource; absent = that profile failed", async () => {
  const fetch = fakeFetch((call) => {
    assert.equal(call.url, "http://api/api/v1/users/profiles");
    assert.deepEqual((call.body as Record<string, unknown>)["user_ids"], [BIG, "5"]);
    return { status: 200, json: { items: [{ user_id: BIG, display_name: "Zoë", avatar_url: "https://cdn/z.png" }], missing_user_ids: ["5"] } };
  });
  const client = new MembersClient({ baseUrl: "http://api", token: "t", fetch });
  const got = await client.profiles([BIG, "5"]);
  assert.deepEqual(got.get(BIG), { displayName: "Zoë", avatarUrl: "https://cdn/z.png" });
  assert.equal(got.has("5"), false);
  await assert.rejects(client.profiles([]), RangeError);
});

test("the presentation carries the caller's remarks only when the server says it read them", async () => {
  let answer: Record<string, unknown> = {};
  const fetch = fakeFetch(() => ({ status: 200, json: answer }));
  const client = new MembersClient({ baseUrl: "http://api", token: "t", fetch });
  const item = (id: string, remark?: unknown) => ({ user_id: id, role: "member", state: "active", active: true, ...(remark === undefined ? {} : { remark }) });
  answer = { items: [item(BIG, "备注 Zoë"), item("5", null)], missing_user_ids: [], stats_included: false, remarks_included: true, self_role: "member" };
  const got = await client.presentation({ group: GROUP, memberRefs: [BIG, "5"] });
  assert.equal(got.remarksIncluded, true);
  assert.deepEqual(got.items.map((m) => [m.memberRef, m.remark]), [[BIG, "备注 Zoë"], ["5", null]]);
  // Not included (late or failed on the server): no remark is read, whatever the items say.
  answer = { ...answer, remarks_included: false, items: [item(BIG, "stale?")] };
  const without = await client.presentation({ group: GROUP, memberRefs: [BIG] });
  assert.equal(without.remarksIncluded, false);
  assert.equal(without.items[0]?.remark, null);
  // Included but not a string or null: a protocol error, never read as "no remark".
  answer = { ...answer, remarks_included: true, items: [item(BIG, 7)] };
  await assert.rejects(client.presentation({ group: GROUP, memberRefs: [BIG] }), /remark must be a string or null/);
});

test("setRemark and clearRemark: PUT and DELETE of the member's remark; a refusal is a request error", async () => {
  const fetch = fakeFetch((call) => {
    if (call.method === "DELETE") return { status: 200, json: { user_id: BIG, remark: null } };
    const remark = (call.body as Record<string, unknown>)["remark"];
    if (remark === "") return error(400, "invalid_remark", "remark must not be empty or only white space (DELETE clears a remark)");
    return { status: 200, json: { user_id: BIG, remark: String(remark).trim() } };
  });
  const client = new MembersClient({ baseUrl: "http://api", token: "t", fetch });
  assert.equal(await client.setRemark({ memberRef: BIG, remark: " Zoë " }), "Zoë");
  assert.equal(fetch.calls[0]?.method, "PUT");
  assert.equal(fetch.calls[0]?.path, `/api/v1/users/${BIG}/remark`);
  await client.clearRemark({ memberRef: BIG });
  assert.deepEqual([fetch.calls[1]?.method, fetch.calls[1]?.path], ["DELETE", `/api/v1/users/${BIG}/remark`]);
  await assert.rejects(client.setRemark({ memberRef: BIG, remark: "" }), (e: unknown) => e instanceof RequestError && e.status === 400 && /DELETE clears/.test(e.message));
  await assert.rejects(client.setRemark({ memberRef: "12.5", remark: "x" }), /u64/); // never sent
  assert.equal(fetch.calls.length, 3);
});
