// Seed 004's timing scenario against this SDK's store: every upstream call (a base page, a
// presentation batch, a public-profile batch) answers after a fixed delay. The seed's own
// observation at 2 s per call: first 50 visible at 2 s, full 500-member roster at 32 s (10 base
// pages, 10 member batches, 10 profile batches); after a restart with the SQLite cache kept, the
// cache answered in ~44 ms and 500 cached members were visible in ~89 ms, before the server. Here
// the delay is 1/20 of it (100 ms) to keep the suite quick; the round-trip counts are what compare.

import { test } from "node:test";
import assert from "node:assert/strict";
import { createRequire } from "node:module";

import { MemberStore, type BaseMember, type CacheKey, type MemberPage, type MemberSource, type PresentationResult, type Profile, type ProfileSource } from "../src/index.js";
import { SqliteMemberCache, type SqliteDatabaseLike } from "../src/host/index.js";

const Database = createRequire(import.meta.url)("better-sqlite3") as new (path: string) => SqliteDatabaseLike;
const LATENCY = 100; // ms: the seed's 2 s upstream at 1/20
const KEY: CacheKey = { environment: "prod", account: "42", group: "g-500" };
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function slowUpstream(ids: string[], pageDelay = LATENCY): MemberSource & ProfileSource {
  const base = (id: string): BaseMember => ({ memberRef: id, userId: id, role: "member", state: "active", joinedAt: 1, leftAt: null });
  return {
    async page(req): Promise<MemberPage> {
      await sleep(pageDelay);
      const start = req.after ? ids.indexOf(req.after) + 1 : 0;
      const items = ids.slice(start, start + (req.limit ?? 50));
      const hasMore = start + items.length < ids.length;
      return { items: items.map(base), hasMore, next: hasMore ? items[items.length - 1]! : null, selfRole: "member" };
    },
    async presentation(req): Promise<PresentationResult> {
      await sleep(LATENCY);
      return { items: req.memberRefs.map((r) => ({ ...base(r), recordCount: 1, mentionCount: 0, statsKnown: true })), missingRefs: [], statsIncluded: true, selfRole: "member" };
    },
    async profiles(refs): Promise<ReadonlyMap<string, Profile>> {
      await sleep(LATENCY);
      return new Map(refs.map((r) => [r, { displayName: `m${r}`, avatarUrl: `a${r}` }]));
    },
  };
}

test("seed 004's timings: first 50 after one round trip, 500 members well within the seed's 16, cached roster before the server", async (t) => {
  const ids = Array.from({ length: 500 }, (_, i) => String(10_000 + i));
  const db = new Database(":memory:");
  const cache = new SqliteMemberCache(db, "runtime-key-0123456789abcdef");

  const upstream = slowUpstream(ids);
  const cold = new MemberStore(KEY, upstream, { cache, profiles: upstream });
  const t0 = performance.now();
  cold.subscribe();
  await cold.until((s) => s.size >= 50);
  const first50 = performance.now() - t0;
  await cold.until((s) => s.fresh);
  const full = performance.now() - t0;
  await cold.settled();
  assert.ok([...cold.members.values()].every((m) => m.displayName !== null && m.statsKnown));
  cold.close();

  const slow = slowUpstream(ids, 20 * LATENCY); // the restart's server: slow to answer
  const warm = new MemberStore(KEY, slow, { cache, profiles: slow });
  const c0 = performance.now();
  const cached = await cache.load(KEY);
  const cacheAnswer = performance.now() - c0;
  assert.equal(cached?.members.length, 500);
  const w0 = performance.now();
  warm.subscribe();
  await warm.until((s) => s.size === 500);
  const cachedVisible = performance.now() - w0;
  assert.equal(warm.fresh, false, "shown from the cache, the server has not answered");
  assert.equal(warm.counters.pages, 0);
  warm.close();

  const rt = (ms: number) => (ms / LATENCY).toFixed(1);
  t.diagnostic(`first 50 visible: ${first50.toFixed(0)} ms = ${rt(first50)} round trips (seed: 1, i.e. 2 s)`);
  t.diagnostic(`full 500 with names and statistics: ${full.toFixed(0)} ms = ${rt(full)} round trips (seed: 16, i.e. 32 s)`);
  t.diagnostic(`cache answer: ${cacheAnswer.toFixed(1)} ms (seed: ~44 ms); 500 cached visible: ${cachedVisible.toFixed(1)} ms (seed: ~89 ms)`);
  assert.ok(first50 < 2 * LATENCY, `first 50 after ${first50} ms`);
  assert.ok(full < 16 * LATENCY, `full roster after ${full} ms`);
  assert.ok(cachedVisible < 20 * LATENCY);
});
