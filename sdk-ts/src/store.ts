// The browser-side member store (seed 004): ONE store per environment/account/group, shared by
// the member drawer, @-candidates and read-receipt details; pages only keep their view state.
//
// * Cache restore and the first server page start together. A cache hit is shown first but is
//   never "fresh" and never skips the server; once a server page of this generation arrived, a
//   late cache result is dropped whole.
// * Pages merge by memberRef: the list is never cleared, an unchanged member keeps its object,
//   and a base page never erases names, avatars or statistics.
// * Presentation runs in batches of at most 50, at most two in flight; paging never waits for
//   it. It only updates members still held: it never creates or revives one. It carries the
//   viewer's own remarks (备注): the server's remark replaces a cached one and null clears it;
//   an answer without remarks (remarksIncluded false) keeps the known ones.
// * A traversal is not a snapshot: members it did not return are checked with the presentation
//   call afterwards and only confirmed removals apply. At most 200 pages per traversal.
// * A generation isolates everything asynchronous (request de-duplication keys, cache writes):
//   it moves on denial, invalidation and deactivation, and aborts the requests of the old one.
// * 2001/2002 clear memory and the cache; any other failure keeps the list (refresh() retries).
// * Notices: kind 24 re-reads the public roster; kind 27 also drops the history window.

import { MemberAccessDeniedError, TraversalLimitError, isAbort } from "./errors.js";
import { compareUserIds, isSafeCount, type MemberRef, type UserId } from "./ids.js";
import {
  PAGE_LIMIT_DEFAULT,
  PRESENTATION_MAX,
  mergeJoinEvents,
  removedRefs,
  type BaseMember,
  type JoinEvent,
  type MemberPage,
  type MemberState,
  type PresentationResult,
  type Role,
} from "./members.js";
import type { CallOptions } from "./http.js";

export const MAX_PAGES = 200;
export const PRESENTATION_PARALLEL = 2;
export const IDLE_GROUPS = 20;
export const IDLE_MEMBERS = 20_000;
export const MEMBER_JOINED = 24;
export const MEMBER_LEFT_HISTORY = 27;

/** A member as the UI shows it. Immutable: replaced only when a field really changes, so a UI
 * comparing objects by identity re-renders exactly the rows that changed. */
export interface StoreMember {
  readonly memberRef: MemberRef;
  readonly userId: UserId;
  readonly role: Role;
  readonly state: MemberState;
  readonly joinedAt: number | null;
  readonly leftAt: number | null;
  readonly displayName: string | null;
  /** The viewer's own remark (备注) on this member: from the presentation, never a profile. */
  readonly remark: string | null;
  readonly avatarUrl: string | null;
  /** Null = unknown (never shown as 0); the row keeps its height. */
  readonly recordCount: number | null;
  readonly mentionCount: number | null;
  readonly statsKnown: boolean;
  /** The public profile lookup failed: the old avatar stays. */
  readonly profileFailed: boolean;
  readonly presented: boolean;
}

/** Public profile data: the same for every viewer (a remark is not: it is the viewer's own). */
export interface Profile {
  readonly displayName: string | null;
  readonly avatarUrl: string | null;
}

/** What the store needs from the server (MembersClient implements it). */
export interface MemberSource {
  page(request: { group: string; after?: string | null; limit?: number; activeOnly?: boolean } & CallOptions): Promise<MemberPage>;
  presentation(request: { group: string; memberRefs: readonly MemberRef[]; includeStats?: boolean } & CallOptions): Promise<PresentationResult>;
}

/** Public profiles in batches of 1..50; a ref missing from the answer = that profile failed. */
export interface ProfileSource {
  profiles(refs: readonly MemberRef[], options: CallOptions): Promise<ReadonlyMap<MemberRef, Profile>>;
}

export interface CacheKey {
  readonly environment: string;
  readonly account: string;
  readonly group: string;
}

export interface CachedRoster {
  readonly members: readonly StoreMember[];
  readonly cachedAtMillis: number;
}

/** The store's cache port (source.members.cached): only the current account/group's display
 * cache; a miss is null. Written only from authorized server results. */
export interface MemberCache {
  load(key: CacheKey, options?: CallOptions): Promise<CachedRoster | null>;
  /** Write the roster unless `stillCurrent()` turned false meanwhile; whether it was written. */
  store(key: CacheKey, members: readonly StoreMember[], stillCurrent: () => boolean): Promise<boolean>;
  delete(key: CacheKey): Promise<void>;
}

export const CACHE_FORMAT_VERSION = 1;
const CACHE_FIELDS = [
  "memberRef", "userId", "role", "state", "joinedAt", "leftAt", "displayName", "remark",
  "avatarUrl", "recordCount", "mentionCount", "statsKnown",
] as const;

/** Only the whitelisted display fields go to a cache (format version 1). */
export function cacheRecord(member: StoreMember): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const field of CACHE_FIELDS) out[field] = member[field];
  return out;
}

/** A cached member back, or null when the record is not format 1's (treated as a miss). */
export function fromCacheRecord(record: unknown): StoreMember | null {
  if (typeof record !== "object" || record === null) return null;
  const r = record as Record<string, unknown>;
  const str = (v: unknown): string | null => (typeof v === "string" ? v : null);
  if (typeof r["memberRef"] !== "string" || typeof r["userId"] !== "string") return null;
  const known = r["statsKnown"] === true && isSafeCount(r["recordCount"]) && isSafeCount(r["mentionCount"]);
  return newMember({
    memberRef: r["memberRef"],
    userId: r["userId"],
    role: (["owner", "admin", "member"].includes(String(r["role"])) ? r["role"] : "member") as Role,
    state: (["active", "left", "removed"].includes(String(r["state"])) ? r["state"] : "active") as MemberState,
    joinedAt: isSafeCount(r["joinedAt"]) ? r["joinedAt"] : null,
    leftAt: isSafeCount(r["leftAt"]) ? r["leftAt"] : null,
  }, {
    displayName: str(r["displayName"]),
    remark: str(r["remark"]),
    avatarUrl: str(r["avatarUrl"]),
    recordCount: known ? (r["recordCount"] as number) : null,
    mentionCount: known ? (r["mentionCount"] as number) : null,
    statsKnown: known,
  });
}

/** An in-memory MemberCache (a browser tab's; the host's SQLite cache implements the same port). */
export class MemoryMemberCache implements MemberCache {
  private readonly rosters = new Map<string, { version: number; records: Record<string, unknown>[]; cachedAtMillis: number }>();
  private readonly now: () => number;

  constructor(options: { now?: () => number } = {}) {
    this.now = options.now ?? Date.now;
  }

  static keyText(key: CacheKey): string {
    return JSON.stringify([key.environment, key.account, key.group]);
  }

  async load(key: CacheKey, options: CallOptions = {}): Promise<CachedRoster | null> {
    options.signal?.throwIfAborted();
    const found = this.rosters.get(MemoryMemberCache.keyText(key));
    if (found === undefined || found.version !== CACHE_FORMAT_VERSION) return null;
    const members: StoreMember[] = [];
    for (const record of found.records) {
      const member = fromCacheRecord(record);
      if (member === null) return null; // a damaged roster is a miss, never half a list
      members.push(member);
    }
    return { members, cachedAtMillis: found.cachedAtMillis };
  }

  async store(key: CacheKey, members: readonly StoreMember[], stillCurrent: () => boolean): Promise<boolean> {
    if (!stillCurrent()) return false;
    this.rosters.set(MemoryMemberCache.keyText(key), { version: CACHE_FORMAT_VERSION, records: members.map(cacheRecord), cachedAtMillis: this.now() });
    return true;
  }

  async delete(key: CacheKey): Promise<void> {
    this.rosters.delete(MemoryMemberCache.keyText(key));
  }
}

function newMember(base: Omit<BaseMember, never>, extra: Partial<StoreMember> = {}): StoreMember {
  return Object.freeze({
    memberRef: base.memberRef,
    userId: base.userId,
    role: base.role,
    state: base.state,
    joinedAt: base.joinedAt,
    leftAt: base.leftAt,
    displayName: null,
    remark: null,
    avatarUrl: null,
    recordCount: null,
    mentionCount: null,
    statsKnown: false,
    profileFailed: false,
    presented: false,
    ...extra,
  });
}

/** `member` with `fields`; the same object when every value is already there. */
function withFields(member: StoreMember, fields: Partial<StoreMember>): StoreMember {
  const entries = Object.entries(fields) as Array<[keyof StoreMember, unknown]>;
  if (entries.every(([k, v]) => member[k] === v)) return member;
  return Object.freeze({ ...member, ...fields });
}

export interface StoreCounters {
  pages: number;
  presentationBatches: number;
  maxPresentationInFlight: number;
  cacheHits: number;
  lateCacheDropped: number;
  removalsConfirmed: number;
  cacheWrites: number;
  traversalsCompleted: number;
  deduplicatedRequests: number;
  cacheCleared: number;
}

export interface MemberStoreOptions {
  cache?: MemberCache;
  profiles?: ProfileSource;
  pageSize?: number;
  maxPages?: number;
  presentationBatch?: number;
  presentationParallel?: number;
  /** Called when the last subscriber leaves (the registry keeps idle stores within bounds). */
  onIdle?: (store: MemberStore) => void;
  /** Called on a kind-27 notice: the host drops its history window for this group. */
  onHistoryInvalidated?: (store: MemberStore) => void;
}

export type Listener = (store: MemberStore) => void;

export interface Subscription {
  close(): void;
}

class Stale extends Error {
  override readonly name = "Stale";
}

/** The member store of one group for one account in one environment. */
export class MemberStore {
  readonly key: CacheKey;
  readonly source: MemberSource;
  readonly counters: StoreCounters = {
    pages: 0, presentationBatches: 0, maxPresentationInFlight: 0, cacheHits: 0, lateCacheDropped: 0,
    removalsConfirmed: 0, cacheWrites: 0, traversalsCompleted: 0, deduplicatedRequests: 0, cacheCleared: 0,
  };
  /** The caller's role from the latest page's access check; never from the cache. */
  selfRole: string | null = null;
  /** The admin entry: from the latest page (group.settings and that page's role), never cached. */
  adminCapabilities: Readonly<Record<string, boolean>> = {};
  /** The join events read, merged across pages by eventRef and invitees by memberRef. */
  joinEvents: Map<string, JoinEvent> = new Map();
  /** Set by a cache hit: the roster shown is the cache's of that time. */
  cachedAtMillis: number | null = null;
  /** A complete server traversal of the current generation landed. */
  fresh = false;
  error: Error | null = null;
  generation = 0;

  private readonly options: MemberStoreOptions;
  private readonly pageSize: number;
  private readonly maxPages: number;
  private readonly batch: number;
  private readonly parallel: number;
  private map = new Map<MemberRef, StoreMember>();
  private sortedCache: StoreMember[] | null = null;
  private listeners: Array<{ listener: Listener | null }> = [];
  private controller = new AbortController();
  private remoteSeenGen = -1;
  private traversal: Promise<void> | null = null;
  private readonly inflight = new Map<string, Promise<unknown>>();
  private presenting = new Set<Promise<void>>();
  private slotsFree: number;
  private readonly slotWaiters: Array<() => void> = [];
  private inFlight = 0;
  private waiters: Array<() => void> = [];

  constructor(key: CacheKey, source: MemberSource, options: MemberStoreOptions = {}) {
    const batch = options.presentationBatch ?? PRESENTATION_MAX;
    if (batch < 1 || batch > PRESENTATION_MAX) throw new RangeError(`presentationBatch must be in 1..${PRESENTATION_MAX}`);
    this.key = key;
    this.source = source;
    this.options = options;
    this.pageSize = options.pageSize ?? PAGE_LIMIT_DEFAULT;
    this.maxPages = options.maxPages ?? MAX_PAGES;
    this.batch = batch;
    this.parallel = options.presentationParallel ?? PRESENTATION_PARALLEL;
    this.slotsFree = this.parallel;
  }

  // -- what subscribers read ----------------------------------------------------------------

  get members(): ReadonlyMap<MemberRef, StoreMember> {
    return this.map;
  }

  get size(): number {
    return this.map.size;
  }

  member(ref: MemberRef): StoreMember | undefined {
    return this.map.get(ref);
  }

  /** Members in user id order (the roster's order). */
  sorted(): readonly StoreMember[] {
    if (this.sortedCache === null) this.sortedCache = [...this.map.values()].sort((a, b) => compareUserIds(a.userId, b.userId));
    return this.sortedCache;
  }

  get active(): boolean {
    return this.listeners.length > 0;
  }

  /** Subscribe; the first subscriber starts loading (cache and server, together). */
  subscribe(listener: Listener | null = null): Subscription {
    const entry = { listener };
    const first = this.listeners.length === 0;
    this.listeners.push(entry);
    if (first) void this.refresh();
    let closed = false;
    return {
      close: () => {
        if (closed) return;
        closed = true;
        this.listeners = this.listeners.filter((e) => e !== entry);
        if (this.listeners.length === 0) {
          this.deactivate();
          this.options.onIdle?.(this);
        }
      },
    };
  }

  /** Stop everything outstanding (last subscriber gone, background, account switch). The
   * members stay in memory, no longer fresh. */
  deactivate(): void {
    this.bump();
    this.fresh = false;
  }

  // -- loading ------------------------------------------------------------------------------

  /** Start a traversal (with a cache restore when nothing is shown yet); a traversal of this
   * generation already running is reused. Resolves when it ends, however it ends. */
  refresh(): Promise<void> {
    if (this.traversal !== null) {
      this.counters.deduplicatedRequests += 1;
      return this.traversal;
    }
    const gen = this.generation;
    const run = this.load(gen).finally(() => {
      if (this.traversal === run) this.traversal = null;
    });
    this.traversal = run;
    return run;
  }

  /** The roster changed on the server: nothing in flight may be reused; a new traversal runs. */
  invalidate(): Promise<void> {
    this.bump();
    return this.refresh();
  }

  /** A member notice for this group: 24 re-reads the roster, 27 also drops the history window.
   * Neither carries a member or read fact to apply. */
  onNotification(kind: number): Promise<void> | null {
    if (kind !== MEMBER_JOINED && kind !== MEMBER_LEFT_HISTORY) return null;
    if (kind === MEMBER_LEFT_HISTORY) this.options.onHistoryInvalidated?.(this);
    if (!this.active) return null; // an idle store reads fresh when next subscribed
    return this.invalidate();
  }

  /** The server confirmed these removals (an admin's removal receipt): out of the list and the
   * cache at once, without a traversal. */
  async applyRemovalReceipt(refs: readonly MemberRef[]): Promise<void> {
    let removed = 0;
    for (const ref of refs) if (this.map.delete(ref)) removed += 1;
    if (removed === 0) return;
    this.counters.removalsConfirmed += removed;
    this.changed();
    if (this.fresh) await this.writeCache(this.generation); // only a whole roster stays whole minus these
  }

  /** Left, dissolved, or access gone: memory and cache go, and nothing in flight brings them back. */
  async clear(): Promise<void> {
    this.bump();
    this.map.clear();
    this.selfRole = null;
    this.adminCapabilities = {};
    this.joinEvents = new Map();
    this.cachedAtMillis = null;
    this.fresh = false;
    this.changed();
    if (this.options.cache !== undefined) {
      await this.options.cache.delete(this.key);
      this.counters.cacheCleared += 1;
    }
  }

  /** Wait until `predicate(this)` holds (checked after every change). */
  async until(predicate: (store: MemberStore) => boolean, options: CallOptions = {}): Promise<void> {
    while (!predicate(this)) {
      options.signal?.throwIfAborted();
      await new Promise<void>((resolve, reject) => {
        this.waiters.push(resolve);
        options.signal?.addEventListener("abort", () => reject(options.signal?.reason), { once: true });
      });
    }
  }

  /** Wait for the traversal in flight (and its cache write) to end, however it ends. */
  async settled(): Promise<void> {
    if (this.traversal !== null) await this.traversal;
  }

  /** Abort everything (shutdown). */
  close(): void {
    this.bump();
    this.listeners = [];
  }

  // -- machinery ------------------------------------------------------------------------------

  private async load(gen: number): Promise<void> {
    // The first page request goes out first, then the cache read starts (a host's SQLite read is
    // synchronous: it must not hold the request back); whichever answers first is shown first.
    const traversal = this.traverse(gen);
    let restore: Promise<void> | null = null;
    if (this.options.cache !== undefined && this.map.size === 0) restore = this.restore(gen);
    try {
      await traversal;
    } catch (error) {
      if (error instanceof Stale || (isAbort(error) && gen !== this.generation)) return;
      if (error instanceof MemberAccessDeniedError) {
        await this.deny(error, gen);
      } else if (gen === this.generation) {
        this.error = error instanceof Error ? error : new Error(String(error)); // the list stays: retry
        this.changed();
      }
    } finally {
      if (restore !== null) await restore.catch(() => undefined);
    }
  }

  private async restore(gen: number): Promise<void> {
    const cache = this.options.cache;
    if (cache === undefined) return;
    let roster: CachedRoster | null;
    try {
      roster = await cache.load(this.key, { signal: this.controller.signal });
    } catch {
      return; // a cache failure is a miss
    }
    if (roster === null) return;
    if (gen !== this.generation || this.remoteSeenGen === gen || this.error instanceof MemberAccessDeniedError) {
      // A server result (or a denial) came first: the cache may not overwrite it.
      this.counters.lateCacheDropped += 1;
      return;
    }
    this.counters.cacheHits += 1;
    for (const member of roster.members) if (!this.map.has(member.memberRef)) this.map.set(member.memberRef, member);
    this.cachedAtMillis = roster.cachedAtMillis;
    this.changed();
  }

  private async traverse(gen: number): Promise<void> {
    const seen = new Set<MemberRef>();
    let after: string | null = null;
    let pages = 0;
    for (;;) {
      if (pages >= this.maxPages) {
        throw new TraversalLimitError(`group ${this.key.group}: more than ${this.maxPages} pages; kept what was read`);
      }
      const cursor: string | null = after;
      const page: MemberPage = await this.request(gen, `page|${cursor ?? ""}`, (signal) =>
        this.source.page({ group: this.key.group, after: cursor, limit: this.pageSize, activeOnly: true, signal }),
      );
      this.check(gen);
      pages += 1;
      this.counters.pages += 1;
      this.remoteSeenGen = gen;
      this.error = null;
      this.selfRole = page.selfRole;
      this.adminCapabilities = page.adminCapabilities ?? {};
      this.joinEvents = mergeJoinEvents(this.joinEvents, page.joinEvents ?? []);
      this.mergeBase(page.items);
      const refs = page.items.map((m) => m.memberRef);
      for (const ref of refs) seen.add(ref);
      for (let i = 0; i < refs.length; i += this.batch) this.schedulePresentation(gen, refs.slice(i, i + this.batch));
      this.changed();
      if (!page.hasMore) break;
      after = page.next;
    }
    const absent = [...this.map.keys()].filter((ref) => !seen.has(ref));
    if (absent.length > 0) await this.verifyAbsent(gen, absent);
    // Names and statistics of this traversal go to the cache with the roster.
    while (this.presenting.size > 0) await Promise.allSettled([...this.presenting]);
    this.check(gen);
    this.fresh = true;
    this.counters.traversalsCompleted += 1;
    this.changed();
    await this.writeCache(gen);
  }

  private mergeBase(items: readonly BaseMember[]): void {
    for (const base of items) {
      const current = this.map.get(base.memberRef);
      if (current === undefined) {
        this.map.set(base.memberRef, newMember(base));
      } else {
        // Base fields only: names, avatars and statistics are never erased by a page.
        this.map.set(base.memberRef, withFields(current, { role: base.role, state: base.state, joinedAt: base.joinedAt, leftAt: base.leftAt }));
      }
    }
  }

  /** Members the traversal did not return: only removals the server confirms apply. */
  private async verifyAbsent(gen: number, absent: MemberRef[]): Promise<void> {
    for (let i = 0; i < absent.length; i += PRESENTATION_MAX) {
      const chunk = absent.slice(i, i + PRESENTATION_MAX);
      const result: PresentationResult = await this.request(gen, `verify|${chunk.join(",")}`, (signal) =>
        this.source.presentation({ group: this.key.group, memberRefs: chunk, includeStats: false, signal }),
      );
      this.check(gen);
      const gone = removedRefs(result);
      for (const ref of chunk) {
        if (gone.has(ref) && this.map.delete(ref)) this.counters.removalsConfirmed += 1;
      }
    }
    this.changed();
  }

  private schedulePresentation(gen: number, refs: MemberRef[]): void {
    const task = this.present(gen, refs).catch(() => undefined);
    this.presenting.add(task);
    void task.finally(() => this.presenting.delete(task));
  }

  private async acquire(): Promise<void> {
    if (this.slotsFree > 0) {
      this.slotsFree -= 1;
      return;
    }
    await new Promise<void>((resolve) => this.slotWaiters.push(resolve));
  }

  private release(): void {
    const next = this.slotWaiters.shift();
    if (next !== undefined) next();
    else this.slotsFree += 1;
  }

  private async present(gen: number, refs: MemberRef[]): Promise<void> {
    await this.acquire();
    let outcome: { live: MemberRef[]; presented: PromiseSettledResult<PresentationResult>; profiles: PromiseSettledResult<ReadonlyMap<MemberRef, Profile>> | null } | null = null;
    let counted = false;
    try {
      if (gen !== this.generation) return;
      const live = refs.filter((ref) => this.map.has(ref));
      if (live.length === 0) return;
      this.inFlight += 1;
      counted = true;
      this.counters.maxPresentationInFlight = Math.max(this.counters.maxPresentationInFlight, this.inFlight);
      this.counters.presentationBatches += 1;
      const signal = this.controller.signal;
      const profileSource = this.options.profiles;
      const [presented, profiles] = await Promise.all([
        settle(this.source.presentation({ group: this.key.group, memberRefs: live, includeStats: true, signal })),
        profileSource === undefined ? Promise.resolve(null) : settle(profileSource.profiles(live, { signal })),
      ]);
      outcome = { live, presented, profiles };
    } finally {
      if (counted) this.inFlight -= 1;
      this.release();
    }
    if (outcome === null || gen !== this.generation) return;
    const { live, presented, profiles } = outcome;
    if (presented.status === "rejected" && presented.reason instanceof MemberAccessDeniedError) {
      await this.deny(presented.reason, gen);
      return;
    }
    this.applyPresentation(
      live,
      presented.status === "fulfilled" ? presented.value : null,
      profiles === null ? undefined : profiles.status === "fulfilled" ? profiles.value : null,
    );
  }

  /** `profiles`: undefined = no profile source; null = the whole batch failed. */
  private applyPresentation(refs: MemberRef[], result: PresentationResult | null, profiles: ReadonlyMap<MemberRef, Profile> | null | undefined): void {
    const byRef = new Map(result?.items.map((item) => [item.memberRef, item]) ?? []);
    for (const ref of refs) {
      const current = this.map.get(ref);
      if (current === undefined) continue; // removed meanwhile: presentation never creates or revives
      const fields: { -readonly [K in keyof StoreMember]?: StoreMember[K] } = {};
      const item = byRef.get(ref);
      if (item !== undefined) {
        fields.presented = true;
        if (item.state === "active") fields.role = item.role;
        if (result?.statsIncluded === true && item.statsKnown) {
          fields.recordCount = item.recordCount;
          fields.mentionCount = item.mentionCount;
          fields.statsKnown = true;
        }
        // Statistics late or invalid: keep what was there, never a fake zero.
        // The viewer's remark as the server has it now (seed 004: the server's presentation wins
        // over a cached one); not included (late, failed): the known remark stays.
        if (result?.remarksIncluded === true) fields.remark = item.remark ?? null;
      }
      if (profiles !== undefined) {
        const profile = profiles?.get(ref);
        if (profile === undefined) {
          fields.profileFailed = true; // the old avatar (and name) stay
        } else {
          fields.displayName = profile.displayName;
          fields.avatarUrl = profile.avatarUrl;
          fields.profileFailed = false;
          fields.presented = true;
        }
      }
      const next = withFields(current, fields);
      if (next !== current) this.map.set(ref, next);
    }
    this.changed();
  }

  /** 2001/2002: the roster is gone for this account: memory and cache cleared; a late cache
   * restore is dropped (it would bring the cleared rows back). */
  private async deny(error: MemberAccessDeniedError, gen: number): Promise<void> {
    if (gen !== this.generation) return;
    await this.clear();
    this.error = error;
    this.changed();
  }

  private async writeCache(gen: number): Promise<void> {
    const cache = this.options.cache;
    if (cache === undefined) return;
    try {
      if (await cache.store(this.key, [...this.map.values()], () => gen === this.generation)) this.counters.cacheWrites += 1;
    } catch {
      /* a cache write failure only costs the next start its head start */
    }
  }

  private bump(): void {
    this.generation += 1;
    this.controller.abort(new DOMExceptionLike("the member store moved on", "AbortError"));
    this.controller = new AbortController();
    this.inflight.clear();
    this.traversal = null;
  }

  private check(gen: number): void {
    if (gen !== this.generation) throw new Stale();
  }

  /** One server request per (generation, request): an identical request of the same generation
   * joins the one in flight; one of a newer generation never does. */
  private request<T>(gen: number, what: string, call: (signal: AbortSignal) => Promise<T>): Promise<T> {
    const key = `${gen}|${what}`;
    const found = this.inflight.get(key);
    if (found !== undefined) {
      this.counters.deduplicatedRequests += 1;
      return found as Promise<T>;
    }
    const promise = call(this.controller.signal).finally(() => this.inflight.delete(key));
    this.inflight.set(key, promise);
    return promise;
  }

  private changed(): void {
    this.sortedCache = null;
    for (const { listener } of this.listeners) listener?.(this);
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}

function settle<T>(promise: Promise<T>): Promise<PromiseSettledResult<T>> {
  return promise.then(
    (value): PromiseFulfilledResult<T> => ({ status: "fulfilled", value }),
    (reason: unknown): PromiseRejectedResult => ({ status: "rejected", reason }),
  );
}

/** An abort reason with name "AbortError" (DOMException is not in every lib the SDK compiles for). */
class DOMExceptionLike extends Error {
  constructor(message: string, name: string) {
    super(message);
    this.name = name;
  }
}

/** The stores of one environment and account. Idle stores stay in memory within 20 groups and
 * 20,000 members (oldest idle whole group out first). An account switch is a new registry:
 * close() the old one. */
export class MemberStoreRegistry {
  readonly environment: string;
  readonly account: string;
  private readonly source: MemberSource;
  private readonly options: Omit<MemberStoreOptions, "onIdle"> & { idleGroups?: number; idleMembers?: number };
  private readonly stores = new Map<string, MemberStore>();
  private readonly idle = new Map<string, null>(); // insertion order: oldest idle first

  constructor(environment: string, account: string, source: MemberSource, options: Omit<MemberStoreOptions, "onIdle"> & { idleGroups?: number; idleMembers?: number } = {}) {
    this.environment = environment;
    this.account = account;
    this.source = source;
    this.options = options;
  }

  /** The one store of `group` for this account. */
  store(group: string): MemberStore {
    let store = this.stores.get(group);
    if (store === undefined) {
      const { idleGroups: _g, idleMembers: _m, ...storeOptions } = this.options;
      store = new MemberStore({ environment: this.environment, account: this.account, group }, this.source, {
        ...storeOptions,
        onIdle: (s) => this.wentIdle(s),
      });
      this.stores.set(group, store);
    }
    return store;
  }

  subscribe(group: string, listener: Listener | null = null): Subscription {
    this.idle.delete(group);
    return this.store(group).subscribe(listener);
  }

  /** A MEMBER_NOTICE off the live stream: the store of that group (if held) reacts. */
  onNotice(notice: { conversation_id: string; kind: number }): Promise<void> | null {
    return this.stores.get(notice.conversation_id)?.onNotification(notice.kind) ?? null;
  }

  idleGroupsHeld(): string[] {
    return [...this.idle.keys()];
  }

  close(): void {
    for (const store of this.stores.values()) store.close();
    this.stores.clear();
    this.idle.clear();
  }

  private wentIdle(store: MemberStore): void {
    const group = store.key.group;
    if (store.size === 0) {
      this.stores.delete(group);
      return;
    }
    this.idle.delete(group);
    this.idle.set(group, null);
    const maxGroups = this.options.idleGroups ?? IDLE_GROUPS;
    const maxMembers = this.options.idleMembers ?? IDLE_MEMBERS;
    const held = (): number => [...this.idle.keys()].reduce((n, g) => n + (this.stores.get(g)?.size ?? 0), 0);
    while (this.idle.size > 0 && (this.idle.size > maxGroups || held() > maxMembers)) {
      const oldest = this.idle.keys().next().value as string;
      this.idle.delete(oldest);
      this.stores.delete(oldest);
    }
  }
}
