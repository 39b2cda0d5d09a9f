import { test } from "node:test";
import assert from "node:assert/strict";

import { MemberStore, WebStorageMemberCache, type CacheKey, type StorageLike, type StoreMember } from "../src/index.js";
import { SqliteMemberCache } from "../src/host/index.js";

class MapStorage implements StorageLike {
  readonly items = new Map<string, string>();
  quota = Infinity;
  getItem(key: string): string | null {
    return this.items.get(key) ?? null;
  }
  setItem(key: string, value: string): void {
    const used = [...this.items].reduce((n, [k, v]) => n + (k === key ? 0 : k.length + v.length), 0);
    if (used + key.length + value.length > this.quota) throw Object.assign(new Error("quota"), { name: "QuotaExceededError" });
    this.items.set(key, value);
  }
  removeItem(key: string): void {
    this.items.delete(key);
  }
}

const KEY: CacheKey = { environment: "web", account: "11982011376358104761", group: "g-1" };
const SIGNING = "a-page-key-0123456789abcdef";

function member(id: string, fields: Partial<StoreMember> = {}): StoreMember {
  return Object.freeze({
    memberRef: id, userId: id, role: "member", state: "active", joinedAt: 1, leftAt: null,
    displayName: `n${id}`, remark: null, avatarUrl: null, recordCount: 3, mentionCount: 0, statsKnown: true,
    profileFailed: false, presented: true, ...fields,
  });
}

test("the web cache round-trips a roster (format 1, user id order) and is bound to its key", async () => {
  const storage = new MapStorage();
  const cache = new WebStorageMemberCache(storage, SIGNING, { now: () => 1_000_000 });
  assert.equal(await cache.store(KEY, [member("10"), member("9"), member("18446744073709551615", { displayName: "Zoë" })]), true);
  const roster = await cache.load(KEY);
  assert.deepEqual(roster?.members.map((m) => m.userId), ["9", "10", "18446744073709551615"]);
  assert.equal(roster?.members[2]?.displayName, "Zoë");
  assert.equal(roster?.cachedAtMillis, 1_000_000);
  assert.deepEqual(cache.usage().rosters, 1);
  assert.equal(await cache.load({ ...KEY, group: "g-2" }), null);
  assert.equal(await cache.load({ ...KEY, account: "5" }), null);
  // Another page key: the signature no longer holds, a miss (and the roster is dropped).
  const other = new WebStorageMemberCache(storage, "another-page-key-000000000");
  assert.equal(await other.load(KEY), null);
  assert.equal(cache.usage().rosters, 0);
});

test("the web cache signs exactly as the host's SQLite cache does", async () => {
  // Same key, time and members: the signature the browser stores is the host's.
  const storage = new MapStorage();
  const web = new WebStorageMemberCache(storage, SIGNING, { now: () => 5_000 });
  await web.store(KEY, [member("7"), member("42", { statsKnown: false, recordCount: null, mentionCount: null })]);
  const stored = JSON.parse([...storage.items].find(([k]) => k.includes("roster:"))![1]) as { signature: string };
  const statements: Array<{ sql: string; params: unknown[] }> = [];
  const db = {
    exec: () => undefined,
    prepare: (sql: string) => ({ run: (...params: unknown[]) => statements.push({ sql, params }), get: () => ({ n: 0, b: 0 }), all: () => [] }),
  };
  const host = new SqliteMemberCache(db, SIGNING, { now: () => 5_000 });
  await host.store(KEY, [member("7"), member("42", { statsKnown: false, recordCount: null, mentionCount: null })]);
  const header = statements.find((s) => s.sql.startsWith("INSERT INTO member_rosters"));
  assert.equal(Buffer.from(header!.params[7] as Uint8Array).toString("hex"), stored.signature);
});

test("the web cache: expired, edited, other-format rosters are misses; limits never truncate", async () => {
  let now = 1_000;
  const storage = new MapStorage();
  const cache = new WebStorageMemberCache(storage, SIGNING, { now: () => now, limits: { maxGroupMembers: 3, maxGroups: 2 } });
  await cache.store(KEY, [member("1"), member("2")]);
  const name = [...storage.items.keys()].find((k) => k.includes("roster:"))!;
  const edited = JSON.parse(storage.getItem(name)!) as { rows: Array<[string, string]> };
  edited.rows[0]![1] = edited.rows[0]![1].replace('"n1"', '"n9"'); // same length: only the signature can tell
  storage.setItem(name, JSON.stringify(edited));
  assert.equal(await cache.load(KEY), null, "an edited payload");
  await cache.store(KEY, [member("1")]);
  storage.setItem(name, storage.getItem(name)!.replace('"format_version":1', '"format_version":2'));
  assert.equal(await cache.load(KEY), null, "another format");
  await cache.store(KEY, [member("1")]);
  now += 15 * 86_400_000;
  assert.equal(await cache.load(KEY), null, "older than 14 days");
  // Over one roster's own limit: not cached, and the older copy goes.
  await cache.store(KEY, [member("1")]);
  assert.equal(await cache.store(KEY, [member("1"), member("2"), member("3"), member("4")]), false);
  assert.equal(await cache.load(KEY), null);
  // Over the global limit of 2 rosters: the oldest whole roster goes.
  for (const [i, group] of ["a", "b", "c"].entries()) {
    now += 1000 * (i + 1);
    await cache.store({ ...KEY, group }, [member("1")]);
  }
  assert.equal(await cache.load({ ...KEY, group: "a" }), null);
  assert.ok((await cache.load({ ...KEY, group: "c" })) !== null);
  // Not current any more when the write comes: nothing lands.
  assert.equal(await cache.store({ ...KEY, group: "d" }, [member("1")], () => false), false);
  assert.equal(await cache.load({ ...KEY, group: "d" }), null);
});

test("the web cache: a quota refusal evicts the oldest whole rosters, then fails cleanly", async () => {
  const storage = new MapStorage();
  let now = 1;
  const cache = new WebStorageMemberCache(storage, SIGNING, { now: () => (now += 1) });
  const big = Array.from({ length: 20 }, (_, i) => member(String(i + 1)));
  await cache.store({ ...KEY, group: "old" }, big);
  storage.quota = [...storage.items].reduce((n, [k, v]) => n + k.length + v.length, 0) + 600;
  assert.equal(await cache.store({ ...KEY, group: "new" }, big), true);
  assert.equal(await cache.load({ ...KEY, group: "old" }), null);
  assert.equal((await cache.load({ ...KEY, group: "new" }))?.members.length, 20);
  storage.quota = 10;
  assert.equal(await cache.store({ ...KEY, group: "new" }, big), false);
});

test("a member store over the web cache: the next start shows the cached roster first", async () => {
  const storage = new MapStorage();
  const cache = new WebStorageMemberCache(storage, WebStorageMemberCache.pageKey(storage));
  const members = ["1", "2", "3"];
  let release: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => (release = resolve));
  let slow = false;
  const source = {
    async page() {
      if (slow) await gate;
      return { items: members.map((id) => ({ memberRef: id, userId: id, role: "member" as const, state: "active" as const, joinedAt: 1, leftAt: null })), hasMore: false, next: null, selfRole: "member" };
    },
    async presentation(req: { memberRefs: readonly string[] }) {
      return { items: req.memberRefs.map((id) => ({ memberRef: id, userId: id, role: "member" as const, state: "active" as const, joinedAt: 1, leftAt: null, recordCount: 1, mentionCount: 0, statsKnown: true })), missingRefs: [], statsIncluded: true, selfRole: "member" };
    },
  };
  const first = new MemberStore(KEY, source, { cache });
  first.subscribe();
  await first.settled();
  assert.equal(first.counters.cacheWrites, 1);
  first.close();
  slow = true;
  const again = new MemberStore(KEY, source, { cache });
  again.subscribe();
  await again.until((s) => s.size === 3);
  assert.equal(again.fresh, false);
  assert.equal(again.counters.cacheHits, 1);
  assert.equal(again.counters.pages, 0);
  release();
  await again.settled();
  assert.equal(again.fresh, true);
  again.close();
});
