// An outside consumer of the SDK: it knows the package only by its name and public entry point
// (a deep import fails: the package's "exports" serves "." alone), compiles under strict
// TypeScript without the DOM lib, and runs against a real `projector api` that
// tests/integration/test_sdk_consumer.py started and seeded. Control files in SP_CONTROL order
// the live-stream steps with the test, which writes the frames a worker would.

import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import {
  LiveSessionList,
  LiveStream,
  MemberAccessDeniedError,
  MemberApiMissingError,
  MemberStore,
  MembersClient,
  MemoryMemberCache,
  REMARK_MAX_CHARS,
  RequestError,
  SessionsClient,
  isAbort,
  isUserId,
  type CacheKey,
  type MemberCache,
  type MemberPage,
  type ReadReceipts,
  type StoreMember,
} from "@session-projector/sdk";
import { SqliteMemberCache, type SqliteDatabaseLike } from "@session-projector/sdk/host";

interface Expect {
  main: string[];
  archived: string[];
  version: number;
  badge: { total_unread: number; total_mention: number; muted_unread: number };
  members: string[];
  stranger_token: string;
  message_seq: number;
  readers: string[];
  unreaders: string[];
  delta: { conversation_id: string; unread_count: number; total_unread: number };
  resumed: { conversation_id: string; unread_count: number; total_unread: number };
}

function env(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") throw new Error(`${name} is not set (run through tests/integration/test_sdk_consumer.py)`);
  return value;
}

const API = env("SP_API_URL");
const TOKEN = env("SP_TOKEN");
const USER = env("SP_USER_ID");
const GROUP = env("SP_GROUP");
const DISABLED_GROUP = env("SP_DISABLED_GROUP");
const CONTROL = env("SP_CONTROL");
const EXPECT = JSON.parse(env("SP_EXPECT")) as Expect;

function signal(name: string, body: unknown = {}): void {
  writeFileSync(join(CONTROL, name), JSON.stringify(body));
}

async function waitFor(name: string, timeoutMs = 120_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!existsSync(join(CONTROL, name))) {
    if (Date.now() > deadline) throw new Error(`no ${name} from the test`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

const sessions = new SessionsClient({ baseUrl: API, token: TOKEN });
const members = new MembersClient({ baseUrl: API, token: TOKEN });

test("walks the user's list with cursors: every row once, in order, ids as exact strings", async () => {
  const main = await sessions.walk({ folder: "main", limit: 7 });
  assert.deepEqual(main.rows.map((r) => r.conversation_id), EXPECT.main);
  assert.equal(main.pages, Math.ceil(EXPECT.main.length / 7));
  assert.equal(main.restarts, 0);
  assert.equal(main.version, EXPECT.version);
  assert.ok(main.rows.every((r) => r.user_id === USER && isUserId(r.user_id)));
  const archived = await sessions.walk({ folder: "archived", limit: 50 });
  assert.deepEqual(archived.rows.map((r) => r.conversation_id), EXPECT.archived);
});

test("reads the badge", async () => {
  const badge = await sessions.badge();
  assert.deepEqual(badge, { ...EXPECT.badge, version: EXPECT.version });
});

test("probes the member API and pages the directory with an AbortSignal", async () => {
  const caps = await members.probe();
  assert.deepEqual(caps, { membersPage: true, presentation: true, readReceipts: true, liveStream: true });
  const controller = new AbortController();
  const ids: string[] = [];
  let after: string | null = null;
  let pages = 0;
  let selfRole = "";
  for (;;) {
    const page: MemberPage = await members.page({ group: GROUP, after, limit: 50, signal: controller.signal });
    pages += 1;
    selfRole = page.selfRole;
    ids.push(...page.items.map((m) => m.memberRef));
    // The admin entry comes with every page, from the group's settings (the owner may remove).
    assert.equal(page.adminCapabilities?.["remove_members"], true);
    if (page.next === null) break;
    // The next page reference is opaque: not the last member's id.
    assert.notEqual(page.next, page.items[page.items.length - 1]?.memberRef);
    after = page.next;
  }
  assert.deepEqual(ids, EXPECT.members);
  assert.equal(pages, Math.ceil(EXPECT.members.length / 50));
  assert.equal(selfRole, "owner");
  // Aborted in flight: the call rejects with the abort, nothing half-applied.
  const abort = new AbortController();
  const pending = members.page({ group: GROUP, signal: abort.signal });
  abort.abort();
  await assert.rejects(pending, (e: unknown) => isAbort(e));

  const shown = await members.presentation({ group: GROUP, memberRefs: EXPECT.members.slice(0, 50), signal: controller.signal });
  assert.equal(shown.items.length, 50);
  assert.deepEqual(shown.missingRefs, []);
  for (const m of shown.items) assert.equal(m.statsKnown, m.recordCount !== null && m.mentionCount !== null);

  // Public profiles (seeded by the Python side: one for the largest u64, none for the caller).
  const profiles = await members.profiles(["18446744073709551615", USER], { signal: controller.signal });
  assert.deepEqual(profiles.get("18446744073709551615"), { displayName: "Zoë", avatarUrl: "https://cdn.example/max.png" });
  assert.equal(profiles.has(USER), false);

  // The caller's own remark (备注): set, seen in the caller's presentation, cleared.
  const target = EXPECT.members.find((m) => m !== USER)!;
  assert.equal(await members.setRemark({ memberRef: target, remark: "  consumer note ", signal: controller.signal }), "consumer note");
  const noted = await members.presentation({ group: GROUP, memberRefs: [target], signal: controller.signal });
  assert.equal(noted.remarksIncluded, true);
  assert.equal(noted.items[0]?.remark, "consumer note");
  await assert.rejects(members.setRemark({ memberRef: target, remark: "x".repeat(REMARK_MAX_CHARS + 1) }), (e: unknown) => e instanceof RequestError && e.status === 400);
  await members.clearRemark({ memberRef: target, signal: controller.signal });
  assert.equal((await members.presentation({ group: GROUP, memberRefs: [target] })).items[0]?.remark, null);

  // Read receipts come a page at a time (limit, opaque pageRef), in roster order.
  const readRefs: string[] = [];
  const unreadRefs: string[] = [];
  let pageRef: string | null = null;
  let receiptPages = 0;
  for (;;) {
    const receipts: ReadReceipts = await members.readReceipts({
      group: GROUP, conversationSeq: EXPECT.message_seq, basicOnly: true, limit: 50, pageRef, signal: controller.signal,
    });
    receiptPages += 1;
    readRefs.push(...receipts.readRefs);
    unreadRefs.push(...receipts.unreadRefs);
    if (receipts.hasMore !== true || receipts.next === null || receipts.next === undefined) break;
    pageRef = receipts.next;
  }
  assert.deepEqual(readRefs, EXPECT.readers);
  assert.deepEqual(unreadRefs, EXPECT.unreaders);
  assert.equal(receiptPages, Math.ceil(EXPECT.members.length / 50));
  // A message the group does not have is a request error (404), never everyone "unread".
  await assert.rejects(
    members.readReceipts({ group: GROUP, conversationSeq: EXPECT.message_seq + 1000, basicOnly: true }),
    (e: unknown) => e instanceof RequestError && e.status === 404,
  );
});

test("one member store per account/group: pages merged by memberRef, cached, 2001 clears it", async () => {
  const cache = new MemoryMemberCache();
  const key = { environment: "consumer", account: USER, group: GROUP };
  const store = new MemberStore(key, members, { cache });
  const seen: StoreMember[][] = [];
  const sub = store.subscribe((s) => seen.push([...s.sorted()]));
  await store.settled();
  assert.ok(store.fresh && store.error === null, String(store.error));
  assert.deepEqual(store.sorted().map((m) => m.memberRef), EXPECT.members);
  assert.equal(store.selfRole, "owner");
  assert.ok(store.counters.pages >= 2 && store.counters.maxPresentationInFlight <= 2);
  sub.close();
  // source.members.cached: this account/group's display cache and its time, or null.
  const cached = await cache.load(key, { signal: AbortSignal.timeout(5_000) });
  assert.equal(cached?.members.length, EXPECT.members.length);
  assert.ok(cached !== null && cached.cachedAtMillis <= Date.now());
  assert.equal(await cache.load({ ...key, group: "another-group" }), null);

  // The cache is shown first on the next start, never as fresh, and the server still answers.
  const again = new MemberStore(key, members, { cache });
  again.subscribe();
  await again.settled();
  assert.equal(again.counters.cacheHits + again.counters.lateCacheDropped, 1);
  assert.ok(again.fresh);
  again.close();

  const stranger = new MemberStore({ ...key, account: "stranger" }, new MembersClient({ baseUrl: API, token: EXPECT.stranger_token }), { cache });
  stranger.subscribe();
  await stranger.settled();
  assert.ok(stranger.error instanceof MemberAccessDeniedError);
  assert.equal(stranger.error.code, "2001");
  assert.equal(stranger.size, 0);
  stranger.close();
});

test("the host entry point: the SQLite cache takes any database of better-sqlite3's shape", () => {
  const statements: string[] = [];
  const db: SqliteDatabaseLike = {
    exec: (sql) => statements.push(sql.trim().split(/\s+/).slice(0, 2).join(" ")),
    prepare: () => ({ run: () => undefined, get: () => ({ n: 0, b: 0 }), all: () => [] }),
  };
  const cache = new SqliteMemberCache(db, "a-runtime-key-of-16+-bytes");
  assert.deepEqual(cache.limits, { maxGroups: 100, maxTotalBytes: 32 * 1024 * 1024, maxGroupMembers: 20_000, maxGroupBytes: 4_000_000, expiryMs: 14 * 86_400_000 });
  assert.equal(cache.usage().rosters, 0);
  assert.deepEqual(statements, ["CREATE TABLE"]);
  assert.throws(() => new SqliteMemberCache(db, "short"), RangeError);
});

test("a backend without the paging API is a clear request error", async () => {
  // The same server under a prefix it does not route: what a backend predating the paging API answers.
  const old = new MembersClient({ baseUrl: `${API}/legacy-chat`, token: TOKEN });
  await assert.rejects(old.page({ group: GROUP }), (e: unknown) => e instanceof MemberApiMissingError && e.status === 404);
  assert.deepEqual(await old.probe(), { membersPage: false, presentation: false, readReceipts: false, liveStream: false });
});

test("the live stream: hello, frames by the rule, then a resume with Last-Event-ID", async () => {
  const list = new LiveSessionList(sessions, USER, { limit: 50 });
  const stream = new LiveStream(list, { reconnectMs: 200 });
  const first = new AbortController();
  let running = stream.run({ signal: first.signal });
  await stream.until(() => stream.synced, { timeoutMs: 60_000 });
  assert.equal(list.view.version, EXPECT.version);
  assert.deepEqual(list.view.main().map((r) => r.conversation_id), EXPECT.main);
  signal("live");
  await stream.until(() => list.view.version === EXPECT.version + 1 && list.view.badge?.version === EXPECT.version + 1, { timeoutMs: 60_000 });
  assert.equal(list.view.row(EXPECT.delta.conversation_id)?.unread_count, EXPECT.delta.unread_count);
  assert.equal(list.view.main()[0]?.conversation_id, EXPECT.delta.conversation_id, "the conversation moved to the top");
  assert.equal(list.view.badge?.total_unread, EXPECT.delta.total_unread);
  first.abort();
  await running;
  const syncs = list.syncs;

  signal("stopped");
  await waitFor("go"); // a frame was written while this client was away
  const second = new AbortController();
  running = stream.run({ signal: second.signal });
  await stream.until(() => list.view.version === EXPECT.version + 2, { timeoutMs: 60_000 });
  assert.equal(stream.stats.hellos["resumed"], 1, JSON.stringify(stream.stats));
  assert.equal(list.syncs, syncs, "a resume pulls nothing");
  assert.equal(list.view.row(EXPECT.resumed.conversation_id)?.unread_count, EXPECT.resumed.unread_count);
  await stream.until(() => list.view.badge?.total_unread === EXPECT.resumed.total_unread, { timeoutMs: 60_000 });
  second.abort();
  await running;
});

/** A cache holding a roster for `key` already (what an earlier session left). */
async function primedCache(key: CacheKey): Promise<MemberCache> {
  const cache = new MemoryMemberCache();
  const old: StoreMember = Object.freeze({
    memberRef: USER, userId: USER, role: "member", state: "active", joinedAt: 1, leftAt: null,
    displayName: "me", remark: null, avatarUrl: null, recordCount: null, mentionCount: null,
    statsKnown: false, profileFailed: false, presented: true,
  });
  await cache.store(key, [old], () => true);
  assert.equal((await cache.load(key))?.members.length, 1);
  return cache;
}

test("2001 and 2002 clear the store and its cache; any other refusal keeps them", async () => {
  // 2002: a conversation its owner disabled (the caller is still an active member).
  const disabledKey = { environment: "consumer", account: USER, group: DISABLED_GROUP };
  const disabledCache = await primedCache(disabledKey);
  await assert.rejects(members.page({ group: DISABLED_GROUP }), (e: unknown) => e instanceof MemberAccessDeniedError && e.code === "2002");
  const disabled = new MemberStore(disabledKey, members, { cache: disabledCache });
  disabled.subscribe();
  await disabled.settled();
  assert.ok(disabled.error instanceof MemberAccessDeniedError && disabled.error.code === "2002", String(disabled.error));
  assert.equal(disabled.size, 0, "nothing of the cached roster survives a 2002");
  assert.equal(await disabledCache.load(disabledKey), null, "the cache is cleared with it");
  assert.equal(disabled.counters.cacheCleared, 1);
  disabled.close();

  // 2001: not a member of the group (another account's token).
  const strangerKey = { environment: "consumer", account: "77", group: GROUP };
  const strangerCache = await primedCache(strangerKey);
  const stranger = new MemberStore(strangerKey, new MembersClient({ baseUrl: API, token: EXPECT.stranger_token }), { cache: strangerCache });
  stranger.subscribe();
  await stranger.settled();
  assert.ok(stranger.error instanceof MemberAccessDeniedError && stranger.error.code === "2001", String(stranger.error));
  assert.equal(stranger.size, 0);
  assert.equal(await strangerCache.load(strangerKey), null);
  stranger.close();

  // A refusal that says nothing about membership (an unknown message: 404) keeps every cache.
  const keptKey = { environment: "consumer", account: USER, group: GROUP };
  const keptCache = await primedCache(keptKey);
  await assert.rejects(
    members.readReceipts({ group: GROUP, conversationSeq: EXPECT.message_seq + 1000 }),
    (e: unknown) => e instanceof RequestError && !(e instanceof MemberAccessDeniedError) && e.status === 404,
  );
  assert.equal((await keptCache.load(keptKey))?.members.length, 1);
});

test("every member call takes an AbortSignal: aborted in flight, it rejects as an abort", async () => {
  const calls: Array<[string, (signal: AbortSignal) => Promise<unknown>]> = [
    ["probe", (signal) => members.probe({ signal })],
    ["page", (signal) => members.page({ group: GROUP, signal })],
    ["presentation", (signal) => members.presentation({ group: GROUP, memberRefs: EXPECT.members.slice(0, 50), signal })],
    ["profiles", (signal) => members.profiles(EXPECT.members.slice(0, 50), { signal })],
    ["read receipts", (signal) => members.readReceipts({ group: GROUP, conversationSeq: EXPECT.message_seq, signal })],
  ];
  for (const [name, call] of calls) {
    const controller = new AbortController();
    const pending = call(controller.signal);
    controller.abort();
    await assert.rejects(pending, (e: unknown) => isAbort(e, controller.signal), name);
    // Already aborted: nothing is sent.
    await assert.rejects(call(AbortSignal.abort()), (e: unknown) => isAbort(e), `${name} (aborted before)`);
  }
  // A store's work ends with its last subscriber: its requests are aborted, not left running.
  const store = new MemberStore({ environment: "consumer", account: USER, group: GROUP }, members);
  const sub = store.subscribe();
  const generation = store.generation;
  sub.close();
  await store.settled();
  assert.ok(store.generation > generation, "the store moved on when its last subscriber left");
  assert.equal(store.fresh, false);
});
