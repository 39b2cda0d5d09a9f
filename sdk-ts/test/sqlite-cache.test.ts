import { test } from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";

import { MemberStore, type CacheKey, type MemberPage, type MemberSource, type PresentationResult, type StoreMember } from "../src/index.js";
import { DAY_MS, SqliteMemberCache, decode, encode, type SqliteDatabaseLike } from "../src/host/index.js";

// better-sqlite3 (a dev dependency): the SDK only needs its exec/prepare shape.
const Database = createRequire(import.meta.url)("better-sqlite3") as new (path: string) => SqliteDatabaseLike & { close(): void };

const KEY: CacheKey = { environment: "prod", account: "11982011376358104761", group: "g-1" };
const SIGNING = "runtime-key-0123456789abcdef";

function member(id: string, fields: Partial<StoreMember> = {}): StoreMember {
  return {
    memberRef: id, userId: id, role: "member", state: "active", joinedAt: 1, leftAt: null, displayName: `name ${id}`, remark: null,
    avatarUrl: `https://cdn/${id}`, recordCount: 3, mentionCount: 0, statsKnown: true, profileFailed: false, presented: true, ...fields,
  };
}

function roster(n: number, from = 1000): StoreMember[] {
  return Array.from({ length: n }, (_, i) => member(String(from + i)));
}

function setup(now = { t: 1_800_000_000_000 }, limits = {}) {
  const db = new Database(":memory:");
  const misses: string[] = [];
  const cache = new SqliteMemberCache(db, SIGNING, { now: () => now.t, limits, onMiss: (_k, why) => misses.push(why) });
  return { db, cache, misses, now };
}

test("a roster round-trips: whitelisted fields, u64 ids as strings, unknown statistics stay unknown", async () => {
  const { cache } = setup();
  const members = [member("18446744073709551615"), member("5", { recordCount: null, mentionCount: null, statsKnown: false, displayName: null })];
  assert.equal(await cache.store(KEY, members, () => true), true);
  const back = await cache.load(KEY);
  assert.ok(back);
  assert.deepEqual(back.members.map((m) => [m.userId, m.statsKnown, m.recordCount]), [["5", false, null], ["18446744073709551615", true, 3]]);
  assert.equal(back.cachedAtMillis, 1_800_000_000_000);
  assert.deepEqual(Object.keys(JSON.parse(encode(members[0]!))).sort(), [
    "avatar_url", "display_name", "joined_at", "left_at", "mention_count", "record_count", "remark", "role", "state", "stats_known", "user_id",
  ]);
  assert.equal(decode(JSON.stringify({ ...JSON.parse(encode(members[0]!)), self_role: "admin" })), null, "no field beyond the whitelist");
});

test("another account or group, an edited row, another runtime key or format: all misses", async () => {
  const { db, cache, misses } = setup();
  await cache.store(KEY, roster(3), () => true);
  for (const table of ["member_rosters", "member_rows"]) db.prepare(`UPDATE ${table} SET account = ?`).run("someone-else");
  assert.equal(await cache.load({ ...KEY, account: "someone-else" }), null); // copied to another account
  await cache.store(KEY, roster(3), () => true);
  db.prepare("UPDATE member_rows SET payload = replace(payload, 'member', 'admin'), payload_bytes = payload_bytes - 1 WHERE position = 1").run();
  db.prepare("UPDATE member_rosters SET payload_bytes = payload_bytes - 1").run();
  assert.equal(await cache.load(KEY), null); // a role edited on disk
  await cache.store(KEY, roster(3), () => true);
  const other = new SqliteMemberCache(db, "another-runtime-key-000000", {});
  assert.equal(await other.load(KEY), null);
  await cache.store(KEY, roster(3), () => true);
  db.prepare("UPDATE member_rosters SET format_version = 2").run();
  assert.equal(await cache.load(KEY), null);
  assert.deepEqual(misses, ["bad signature", "bad signature", "format version 2"]); // the other key's cache reports to no one
  assert.equal(cache.usage().rosters, 0, "an unusable roster is deleted at once");
});

test("14-day expiry, payload_bytes headers, and one roster over its limits is not cached at all", async () => {
  const { cache, now } = setup(undefined, { maxGroupMembers: 10 });
  await cache.store(KEY, roster(5), () => true);
  const { bytes } = cache.usage();
  assert.equal(bytes, roster(5).map(encode).reduce((n, p) => n + Buffer.byteLength(p), 0));
  now.t += 14 * DAY_MS;
  assert.ok(await cache.load(KEY), "14 days is still fresh");
  now.t += 1;
  assert.equal(await cache.load(KEY), null);
  now.t = 1_800_000_000_000;
  await cache.store(KEY, roster(5), () => true);
  assert.equal(await cache.store(KEY, roster(11), () => true), false);
  assert.equal(await cache.load(KEY), null, "never a truncated roster, and the old copy is out of date");
});

test("over the global limits the oldest whole rosters go", async () => {
  const { cache, now } = setup(undefined, { maxGroups: 3 });
  for (const g of ["a", "b", "c", "d"]) {
    now.t += 1000;
    await cache.store({ ...KEY, group: g }, roster(4), () => true);
  }
  assert.equal(await cache.load({ ...KEY, group: "a" }), null);
  for (const g of ["b", "c", "d"]) assert.equal((await cache.load({ ...KEY, group: g }))?.members.length, 4);
  const bytes = setup(undefined, { maxTotalBytes: 2 * roster(4).map(encode).reduce((n, p) => n + Buffer.byteLength(p), 0) });
  for (const g of ["a", "b", "c"]) {
    bytes.now.t += 1000;
    await bytes.cache.store({ ...KEY, group: g }, roster(4), () => true);
  }
  assert.deepEqual(bytes.cache.usage().rosters, 2);
  assert.equal(await bytes.cache.load({ ...KEY, group: "a" }), null);
});

test("a write that is no longer current does not land (a clear won the race)", async () => {
  const { cache } = setup();
  assert.equal(await cache.store(KEY, roster(2), () => false), false);
  assert.equal(await cache.load(KEY), null);
});

test("the member store on the SQLite cache: a restart shows the cached roster before the server answers", async () => {
  const db = new Database(":memory:");
  const cache = new SqliteMemberCache(db, SIGNING);
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  let held = false;
  const source: MemberSource = {
    async page(): Promise<MemberPage> {
      if (held) await gate;
      return { items: roster(3).map((m) => ({ memberRef: m.memberRef, userId: m.userId, role: m.role, state: m.state, joinedAt: 1, leftAt: null })), hasMore: false, next: null, selfRole: "member" };
    },
    async presentation(req): Promise<PresentationResult> {
      return { items: [], missingRefs: req.memberRefs.filter((r) => r === "1002"), statsIncluded: false, selfRole: "member" };
    },
  };
  const first = new MemberStore(KEY, source, { cache });
  first.subscribe();
  await first.settled();
  first.close();
  held = true;
  const second = new MemberStore(KEY, source, { cache });
  second.subscribe();
  await second.until((s) => s.counters.cacheHits === 1);
  assert.equal(second.size, 3);
  assert.equal(second.fresh, false);
  release();
  await second.settled();
  assert.ok(second.fresh);
  second.close();
});
