import { test } from "node:test";
import assert from "node:assert/strict";

import {
  MemberAccessDeniedError,
  MemberApiMissingError,
  MemberStore,
  MemberStoreRegistry,
  MemoryMemberCache,
  TraversalLimitError,
  type BaseMember,
  type CacheKey,
  type MemberPage,
  type MemberSource,
  type PresentationResult,
  type Profile,
  type StoreMember,
} from "../src/index.js";
import { tick } from "./fakes.js";

const KEY: CacheKey = { environment: "test", account: "5", group: "g1" };

function base(id: number | string, fields: Partial<BaseMember> = {}): BaseMember {
  const ref = String(id);
  return { memberRef: ref, userId: ref, role: "member", state: "active", joinedAt: 1, leftAt: null, ...fields };
}

type Gate = Promise<void> | null;

/** A server roster in memory, paged by user id order, with hooks to delay or fail calls. */
class FakeSource implements MemberSource {
  roster: BaseMember[];
  stats = new Map<string, [number, number]>();
  /** The caller's remarks on the server; null: the server could not read them (not included). */
  remarks: Map<string, string> | null = new Map();
  pageCalls = 0;
  presentationCalls: string[][] = [];
  inFlight = 0;
  maxInFlight = 0;
  pageGate: Gate = null;
  presentGate: Gate = null;
  deny: "2001" | "2002" | null = null;
  missing = false;
  signals: AbortSignal[] = [];
  onPresent: ((refs: readonly string[]) => void) | null = null;

  constructor(ids: number[]) {
    this.roster = ids.map((i) => base(i));
  }

  async page(request: { after?: string | null; limit?: number; signal?: AbortSignal | undefined }): Promise<MemberPage> {
    this.pageCalls += 1;
    if (request.signal) this.signals.push(request.signal);
    if (this.pageGate) await this.pageGate;
    request.signal?.throwIfAborted();
    if (this.missing) throw new MemberApiMissingError("members page", 404);
    if (this.deny) throw new MemberAccessDeniedError(this.deny);
    const limit = request.limit ?? 50;
    const active = this.roster.filter((m) => m.state === "active").sort((a, b) => Number(BigInt(a.userId) - BigInt(b.userId)));
    const start = request.after ? active.findIndex((m) => BigInt(m.userId) > BigInt(request.after!)) : 0;
    const items = start < 0 ? [] : active.slice(start, start + limit);
    const hasMore = start >= 0 && start + limit < active.length;
    return { items, hasMore, next: hasMore ? items[items.length - 1]!.userId : null, selfRole: "admin" };
  }

  async presentation(request: { memberRefs: readonly string[]; includeStats?: boolean; signal?: AbortSignal | undefined }): Promise<PresentationResult> {
    this.presentationCalls.push([...request.memberRefs]);
    this.inFlight += 1;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    try {
      this.onPresent?.(request.memberRefs);
      if (this.presentGate) await this.presentGate;
      await tick();
      request.signal?.throwIfAborted();
      if (this.deny) throw new MemberAccessDeniedError(this.deny);
      const byRef = new Map(this.roster.map((m) => [m.memberRef, m]));
      const items = request.memberRefs.filter((r) => byRef.has(r)).map((r) => {
        const s = this.stats.get(r);
        return { ...byRef.get(r)!, recordCount: s?.[0] ?? null, mentionCount: s?.[1] ?? null, statsKnown: s !== undefined, remark: this.remarks?.get(r) ?? null };
      });
      return { items, missingRefs: request.memberRefs.filter((r) => !byRef.has(r)), statsIncluded: request.includeStats === true, remarksIncluded: this.remarks !== null, selfRole: "admin" };
    } finally {
      this.inFlight -= 1;
    }
  }
}

function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

const range = (from: number, n: number): number[] => Array.from({ length: n }, (_, i) => from + i);

test("pages of 50 merge by memberRef; presentation in batches of <= 50, at most two in flight", async () => {
  const source = new FakeSource(range(1000, 500));
  const store = new MemberStore(KEY, source);
  store.subscribe();
  await store.settled();
  assert.equal(store.size, 500);
  assert.equal(source.pageCalls, 10);
  assert.ok(store.fresh);
  assert.equal(store.selfRole, "admin");
  assert.ok(source.presentationCalls.every((c) => c.length <= 50 && c.length >= 1));
  assert.equal(source.presentationCalls.length, 10);
  assert.ok(source.maxInFlight <= 2 && store.counters.maxPresentationInFlight <= 2);
  assert.equal(store.sorted()[0]?.userId, "1000");
});

test("a re-read keeps unchanged member objects and never erases names or statistics", async () => {
  const source = new FakeSource([1, 2, 3]);
  source.stats.set("1", [7, 2]);
  const profiles = { profiles: async (refs: readonly string[]) => new Map<string, Profile>(refs.map((r) => [r, { displayName: `n${r}`, avatarUrl: `a${r}` }])) };
  const store = new MemberStore(KEY, source, { profiles });
  store.subscribe();
  await store.settled();
  const before = new Map(store.members);
  assert.equal(store.member("1")?.displayName, "n1");
  assert.deepEqual([store.member("1")?.recordCount, store.member("1")?.statsKnown], [7, true]);
  assert.deepEqual([store.member("2")?.recordCount, store.member("2")?.statsKnown], [null, false], "unknown is not zero");
  source.roster[1] = base(2, { role: "admin" });
  await store.invalidate();
  assert.equal(store.member("1"), before.get("1"), "an unchanged member keeps its object");
  assert.notEqual(store.member("2"), before.get("2"));
  assert.equal(store.member("2")?.role, "admin");
  assert.equal(store.member("2")?.displayName, "n2", "a base page never erases presentation fields");
});

test("presentation never creates or revives a member", async () => {
  const source = new FakeSource([1, 2, 3]);
  const hold = gate();
  source.presentGate = hold.promise;
  const store = new MemberStore(KEY, source);
  store.subscribe();
  await store.until((s) => s.size === 3);
  await store.applyRemovalReceipt(["2"]); // removed while its presentation is in flight
  hold.open();
  await store.settled();
  assert.equal(store.member("2"), undefined);
  assert.deepEqual([...store.members.keys()].sort(), ["1", "3"]);
});

test("a traversal is not a snapshot: only removals the server confirms apply", async () => {
  const cache = new MemoryMemberCache();
  const source = new FakeSource([1, 2, 3, 4]);
  const first = new MemberStore(KEY, source, { cache });
  const sub = first.subscribe();
  await first.settled();
  sub.close();
  const again = new MemberStore(KEY, source, { cache });
  source.roster[1] = base(2, { state: "left" });
  // 3 is active but this traversal misses it (paging is not atomic): it must stay.
  const page = source.page.bind(source);
  source.page = async (req) => {
    const p = await page(req);
    return { ...p, items: p.items.filter((m) => m.memberRef !== "3") };
  };
  const hold = gate();
  source.pageGate = hold.promise;
  again.subscribe();
  await again.until((s) => s.counters.cacheHits === 1);
  assert.equal(again.size, 4);
  assert.equal(again.fresh, false, "a cache hit is shown but is never fresh");
  hold.open();
  await again.settled();
  assert.deepEqual([...again.members.keys()].sort(), ["1", "3", "4"]);
  assert.equal(again.counters.removalsConfirmed, 1);
});

test("a late cache result never overwrites the server's answer", async () => {
  const cache = new MemoryMemberCache();
  await cache.store(KEY, [1, 2, 99].map((i) => ({ ...base(i), displayName: null, remark: null, avatarUrl: null, recordCount: null, mentionCount: null, statsKnown: false, profileFailed: false, presented: false }) as StoreMember), () => true);
  const slowCache = { ...cache, load: async (key: CacheKey) => { await tick(20); return cache.load(key); }, store: cache.store.bind(cache), delete: cache.delete.bind(cache) };
  const source = new FakeSource([1, 2]);
  const store = new MemberStore(KEY, source, { cache: slowCache });
  store.subscribe();
  await store.settled();
  await tick(40);
  assert.equal(store.counters.lateCacheDropped, 1);
  assert.equal(store.member("99"), undefined);
});

test("2001/2002 clear memory and cache; a late cache restore does not bring rows back", async () => {
  for (const code of ["2001", "2002"] as const) {
    const cache = new MemoryMemberCache();
    const source = new FakeSource([1, 2, 3]);
    const store = new MemberStore(KEY, source, { cache });
    store.subscribe();
    await store.settled();
    assert.ok(await cache.load(KEY));
    source.deny = code;
    await store.invalidate();
    assert.equal(store.size, 0);
    assert.ok(store.error instanceof MemberAccessDeniedError && store.error.code === code);
    assert.equal(await cache.load(KEY), null, "the cached roster is gone");
    assert.equal(store.selfRole, null);
  }
});

test("any other failure keeps the list; a backend without paging is a clear error, cache kept", async () => {
  const cache = new MemoryMemberCache();
  const source = new FakeSource([1, 2]);
  const store = new MemberStore(KEY, source, { cache });
  store.subscribe();
  await store.settled();
  source.missing = true;
  await store.invalidate();
  assert.ok(store.error instanceof MemberApiMissingError);
  assert.equal(store.size, 2);
  assert.ok(await cache.load(KEY));
});

test("a traversal stops at 200 pages, keeps what it read, and says so", async () => {
  const source = new FakeSource(range(1, 205));
  const store = new MemberStore(KEY, source, { pageSize: 1 });
  store.subscribe();
  await store.settled();
  assert.ok(store.error instanceof TraversalLimitError);
  assert.equal(store.size, 200);
  assert.equal(store.fresh, false);
});

test("a new generation aborts the old one's requests and never joins them", async () => {
  const source = new FakeSource([1, 2]);
  const hold = gate();
  source.pageGate = hold.promise;
  const store = new MemberStore(KEY, source);
  store.subscribe();
  await tick();
  const oldSignal = source.signals[0]!;
  const again = store.invalidate(); // the roster changed on the server
  assert.ok(oldSignal.aborted);
  hold.open();
  await again;
  assert.equal(source.pageCalls, 2);
  assert.ok(store.fresh);
});

test("notices: 24 re-reads the roster, 27 also drops the history window; others nothing", async () => {
  const source = new FakeSource([1]);
  let history = 0;
  const registry = new MemberStoreRegistry("test", "5", source, { onHistoryInvalidated: () => (history += 1) });
  registry.subscribe("g1");
  await registry.store("g1").settled();
  source.roster.push(base(2));
  await registry.onNotice({ conversation_id: "g1", kind: 24 });
  assert.equal(registry.store("g1").size, 2);
  assert.equal(history, 0);
  await registry.onNotice({ conversation_id: "g1", kind: 27 });
  assert.equal(history, 1);
  assert.equal(registry.onNotice({ conversation_id: "g1", kind: 99 }), null);
  assert.equal(registry.onNotice({ conversation_id: "other", kind: 24 }), null);
  registry.close();
});

test("idle stores stay within the group and member bounds, oldest idle out first", async () => {
  const source = new FakeSource([1, 2, 3]);
  const registry = new MemberStoreRegistry("test", "5", source, { idleGroups: 2, idleMembers: 1000 });
  for (const g of ["a", "b", "c"]) {
    const sub = registry.subscribe(g);
    await registry.store(g).settled();
    sub.close();
  }
  assert.deepEqual(registry.idleGroupsHeld(), ["b", "c"]);
  const small = new MemberStoreRegistry("test", "5", source, { idleMembers: 5 });
  for (const g of ["a", "b"]) {
    const sub = small.subscribe(g);
    await small.store(g).settled();
    sub.close();
  }
  assert.deepEqual(small.idleGroupsHeld(), ["b"]);
});

test("the first page request goes out before the cache read starts, and the cache still shows first", async () => {
  const order: string[] = [];
  const source = new FakeSource([1, 2]);
  const hold = gate();
  source.pageGate = hold.promise;
  const page = source.page.bind(source);
  source.page = (req) => {
    order.push("page");
    return page(req);
  };
  const memory = new MemoryMemberCache();
  const first = new MemberStore(KEY, new FakeSource([1, 2, 3]), { cache: memory });
  first.subscribe();
  await first.settled();
  const cache = { load: (key: CacheKey) => (order.push("cache"), memory.load(key)), store: memory.store.bind(memory), delete: memory.delete.bind(memory) };
  const store = new MemberStore(KEY, source, { cache });
  store.subscribe();
  assert.deepEqual(order, ["page", "cache"]);
  await store.until((s) => s.counters.cacheHits === 1);
  assert.equal(store.size, 3);
  hold.open();
  await store.settled();
  assert.deepEqual([...store.members.keys()].sort(), ["1", "2"]); // 3: confirmed gone by the server
});

test("the viewer's remark comes from the presentation: the server's replaces a cached one, null clears it", async () => {
  const cache = new MemoryMemberCache();
  const source = new FakeSource([1, 2, 3, 4]);
  source.remarks = new Map([["1", "old note"], ["2", "to clear"], ["3", "same"]]);
  // Public profiles never carry a remark: a profile answer must not touch it.
  const profiles = { profiles: async (refs: readonly string[]) => new Map<string, Profile>(refs.map((r) => [r, { displayName: `n${r}`, avatarUrl: `a${r}` }])) };
  const first = new MemberStore(KEY, source, { cache, profiles });
  const sub = first.subscribe();
  await first.settled();
  assert.deepEqual(first.sorted().map((m) => m.remark), ["old note", "to clear", "same", null]);
  assert.equal(first.member("1")?.displayName, "n1");
  sub.close();

  // On the server: one remark changed, one cleared. Restart: the cache shows first, then the server wins.
  source.remarks = new Map([["1", "new note"], ["3", "same"]]);
  const hold = gate();
  source.pageGate = hold.promise;
  const again = new MemberStore(KEY, source, { cache, profiles });
  again.subscribe();
  await again.until((s) => s.counters.cacheHits === 1);
  assert.deepEqual(again.sorted().map((m) => m.remark), ["old note", "to clear", "same", null], "the cached remarks first");
  hold.open();
  await again.settled();
  assert.deepEqual(again.sorted().map((m) => m.remark), ["new note", null, "same", null]);
  const stored = await cache.load(KEY);
  assert.deepEqual(stored?.members.map((m) => [m.memberRef, m.remark]), [["1", "new note"], ["2", null], ["3", "same"], ["4", null]]);

  // Remarks not included this time (late or failed on the server): the known ones stay.
  source.remarks = null;
  await again.invalidate();
  assert.deepEqual(again.sorted().map((m) => m.remark), ["new note", null, "same", null]);
});

test("a late cache never brings an old remark back over the server's presentation", async () => {
  const cache = new MemoryMemberCache();
  const stale = [1, 2].map((i) => ({ ...base(i), displayName: null, remark: `cached ${i}`, avatarUrl: null, recordCount: null, mentionCount: null, statsKnown: false, profileFailed: false, presented: true }) as StoreMember);
  await cache.store(KEY, stale, () => true);
  const release = gate();
  // Read at once (the stale roster), answered only when released: after the server's answer.
  const slowCache = { load: async (key: CacheKey) => { const roster = await cache.load(key); await release.promise; return roster; }, store: cache.store.bind(cache), delete: cache.delete.bind(cache) };
  const source = new FakeSource([1, 2]);
  source.remarks = new Map([["1", "server note"]]);
  const store = new MemberStore(KEY, source, { cache: slowCache });
  store.subscribe();
  await store.until((s) => s.counters.traversalsCompleted === 1);
  release.open(); // the cache answers only now, after the server's presentation
  await store.settled();
  await tick(5);
  assert.equal(store.counters.lateCacheDropped, 1);
  assert.deepEqual(store.sorted().map((m) => m.remark), ["server note", null]);
  assert.deepEqual((await cache.load(KEY))?.members.map((m) => m.remark), ["server note", null]);
});
