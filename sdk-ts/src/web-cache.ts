// The browser's member cache: seed 004's cache rules over Web Storage (localStorage), for a page
// that has no host process with SQLite behind it (the page the API serves at /app/). The same
// record format as the host's SQLite cache (cache-format.ts) and the same rules:
//
// * Format version 1 only, whitelisted display fields only; anything else is a miss.
// * Signed: HMAC-SHA256 (Web Crypto) over (format, environment, account, group, cached_at, member
//   count, a digest of every row) under the key given, exactly as the host signs. A roster copied
//   to another account/group key, edited in storage or written under another key is a miss. In a
//   browser the key lives in the page's own storage: this is integrity, not a secret; the cache
//   never authorizes anything (every operation is checked by the server).
// * Bounded without reading payloads: an index entry per roster holds its payload_bytes and
//   member count; 100 rosters / 32 MiB in all (further limited by the origin's storage quota),
//   20,000 members / 4 MB per roster, 14-day expiry. A roster over its own limit is not cached
//   (and its old copy goes); over the global limits, or when the browser refuses the write for
//   quota, the oldest WHOLE rosters go first, never part of one.
// * Failures are misses: a read error is null, a failed write returns false.
// * Generation-checked writes: `stillCurrent()` is asked right before the (synchronous) storage
//   write, after the asynchronous signing: a write begun before a 2001/2002 clear never lands.

import {
  DEFAULT_LIMITS,
  FORMAT_VERSION,
  FUTURE_TOLERANCE_MS,
  asciiJson,
  decode,
  encode,
  type CacheLimits,
} from "./cache-format.js";
import { compareUserIds } from "./ids.js";
import type { CallOptions } from "./http.js";
import type { CacheKey, CachedRoster, MemberCache, StoreMember } from "./store.js";

/** What the cache uses of a Web Storage object (window.localStorage has it). */
export interface StorageLike {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

export interface WebStorageMemberCacheOptions {
  /** Milliseconds since the epoch (Date.now by default). */
  now?: () => number;
  limits?: Partial<CacheLimits>;
  /** Prefix of every storage key. Default "sp-members:v1:". */
  prefix?: string;
  /** Told why a roster was a miss (logs, tests). */
  onMiss?: (key: CacheKey, why: string) => void;
}

interface IndexEntry {
  cachedAtMs: number;
  memberCount: number;
  payloadBytes: number;
}

interface StoredRoster {
  format_version: number;
  environment: string;
  account: string;
  group: string;
  cached_at_ms: number;
  member_count: number;
  payload_bytes: number;
  signature: string;
  rows: Array<[string, string]>;
}

interface SubtleLike {
  importKey(format: "raw", key: Uint8Array, algorithm: { name: string; hash: string }, extractable: boolean, usages: string[]): Promise<unknown>;
  sign(algorithm: string, key: unknown, data: Uint8Array): Promise<ArrayBuffer>;
  digest(algorithm: string, data: Uint8Array): Promise<ArrayBuffer>;
}

const utf8 = new TextEncoder();

function subtle(): SubtleLike {
  const found = (globalThis as unknown as { crypto?: { subtle?: SubtleLike } }).crypto?.subtle;
  if (found === undefined) throw new TypeError("no Web Crypto here (crypto.subtle): a secure context is needed");
  return found;
}

function hex(buffer: ArrayBuffer): string {
  return [...new Uint8Array(buffer)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

function concat(parts: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.length;
  }
  return out;
}

function lengthPrefix(n: number): Uint8Array {
  const out = new Uint8Array(8);
  new DataView(out.buffer).setBigUint64(0, BigInt(n));
  return out;
}

/** Member rosters in Web Storage, keyed by (environment, account, group). Implements MemberCache. */
export class WebStorageMemberCache implements MemberCache {
  readonly limits: CacheLimits;
  private readonly storage: StorageLike;
  private readonly keyBytes: Uint8Array;
  private readonly now: () => number;
  private readonly prefix: string;
  private readonly onMiss: ((key: CacheKey, why: string) => void) | undefined;
  private hmacKey: Promise<unknown> | null = null;

  constructor(storage: StorageLike, signingKey: string | Uint8Array, options: WebStorageMemberCacheOptions = {}) {
    const key = typeof signingKey === "string" ? utf8.encode(signingKey) : signingKey;
    if (key.length < 16) throw new RangeError("the cache signing key must be at least 16 bytes");
    this.storage = storage;
    this.keyBytes = key;
    this.now = options.now ?? Date.now;
    this.limits = { ...DEFAULT_LIMITS, ...(options.limits ?? {}) };
    this.prefix = options.prefix ?? "sp-members:v1:";
    this.onMiss = options.onMiss;
  }

  /** A signing key for a page: kept in `storage` under the prefix, made once with
   * crypto.getRandomValues (a new key makes every roster written under the old one a miss). */
  static pageKey(storage: StorageLike, prefix = "sp-members:v1:"): string {
    const name = `${prefix}key`;
    const held = storage.getItem(name);
    if (held !== null && /^[0-9a-f]{64}$/.test(held)) return held;
    const bytes = new Uint8Array(32);
    (globalThis as unknown as { crypto: { getRandomValues(a: Uint8Array): Uint8Array } }).crypto.getRandomValues(bytes);
    const made = hex(bytes.buffer);
    storage.setItem(name, made);
    return made;
  }

  /** The cached roster, or null on any kind of miss (absent, expired, corrupt, other format, bad
   * signature, storage failure). */
  async load(key: CacheKey, options: CallOptions = {}): Promise<CachedRoster | null> {
    options.signal?.throwIfAborted();
    try {
      const text = this.storage.getItem(this.rosterName(key));
      if (text === null) return null;
      const stored = JSON.parse(text) as StoredRoster;
      const now = this.now();
      if (stored.format_version !== FORMAT_VERSION) return this.miss(key, `format version ${String(stored.format_version)}`);
      if (stored.environment !== key.environment || stored.account !== key.account || stored.group !== key.group) {
        return this.miss(key, "stored under another account/group");
      }
      if (!Number.isSafeInteger(stored.cached_at_ms) || stored.cached_at_ms > now + FUTURE_TOLERANCE_MS) return this.miss(key, "cached_at in the future");
      if (now - stored.cached_at_ms > this.limits.expiryMs) return this.miss(key, "expired");
      const rows = stored.rows;
      if (!Array.isArray(rows) || rows.length !== stored.member_count) return this.miss(key, "row count disagrees with the header");
      let bytes = 0;
      for (const row of rows) bytes += Array.isArray(row) && typeof row[1] === "string" ? utf8.encode(row[1]).length : Number.NaN;
      if (bytes !== stored.payload_bytes) return this.miss(key, "payload bytes disagree with the header");
      const expected = await this.sign(key, stored.cached_at_ms, rows);
      options.signal?.throwIfAborted();
      if (expected !== stored.signature) return this.miss(key, "bad signature");
      const members: StoreMember[] = [];
      for (const [userId, payload] of rows) {
        const member = decode(payload);
        if (member === null || member.userId !== userId) return this.miss(key, `corrupt row for user ${userId}`);
        members.push(member);
      }
      return { members, cachedAtMillis: stored.cached_at_ms };
    } catch (error) {
      if (options.signal?.aborted) throw options.signal.reason;
      this.onMiss?.(key, `read failed: ${(error as Error)?.message ?? String(error)}`);
      return null;
    }
  }

  /** Write a whole roster, replacing the previous one. False when not written: over one roster's
   * limits, no longer current, or refused by the storage even after evicting older rosters. */
  async store(key: CacheKey, members: readonly StoreMember[], stillCurrent: () => boolean = () => true): Promise<boolean> {
    try {
      const rows: Array<[string, string]> = [...members]
        .sort((a, b) => compareUserIds(a.userId, b.userId))
        .map((m) => [m.userId, encode(m)]);
      const bytes = rows.reduce((n, [, payload]) => n + utf8.encode(payload).length, 0);
      if (rows.length > this.limits.maxGroupMembers || bytes > this.limits.maxGroupBytes) {
        this.remove(key); // never a truncated roster; the older copy is now out of date
        return false;
      }
      const cachedAt = this.now();
      const signature = await this.sign(key, cachedAt, rows);
      if (!stillCurrent()) return false;
      const stored: StoredRoster = {
        format_version: FORMAT_VERSION,
        environment: key.environment,
        account: key.account,
        group: key.group,
        cached_at_ms: cachedAt,
        member_count: rows.length,
        payload_bytes: bytes,
        signature,
        rows,
      };
      const text = JSON.stringify(stored);
      const index = this.readIndex();
      index[this.keyText(key)] = { cachedAtMs: cachedAt, memberCount: rows.length, payloadBytes: bytes };
      this.evict(index, key);
      for (;;) {
        try {
          this.storage.setItem(this.rosterName(key), text);
          break;
        } catch (error) {
          // The origin's quota: the oldest whole roster out, then try again.
          if (!this.evictOldest(index, key)) throw error;
        }
      }
      this.writeIndex(index);
      return true;
    } catch {
      return false;
    }
  }

  async delete(key: CacheKey): Promise<void> {
    try {
      this.remove(key);
    } catch {
      /* a failed delete leaves a roster the next load verifies anyway */
    }
  }

  /** (rosters, payload bytes) held, from the index alone. */
  usage(): { rosters: number; bytes: number } {
    const entries = Object.values(this.readIndex());
    return { rosters: entries.length, bytes: entries.reduce((n, e) => n + e.payloadBytes, 0) };
  }

  // -- machinery ------------------------------------------------------------------------------

  private keyText(key: CacheKey): string {
    return JSON.stringify([key.environment, key.account, key.group]);
  }

  private rosterName(key: CacheKey): string {
    return `${this.prefix}roster:${this.keyText(key)}`;
  }

  private readIndex(): Record<string, IndexEntry> {
    try {
      const text = this.storage.getItem(`${this.prefix}index`);
      const parsed: unknown = text === null ? {} : JSON.parse(text);
      return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed) ? (parsed as Record<string, IndexEntry>) : {};
    } catch {
      return {};
    }
  }

  private writeIndex(index: Record<string, IndexEntry>): void {
    this.storage.setItem(`${this.prefix}index`, JSON.stringify(index));
  }

  private miss(key: CacheKey, why: string): null {
    this.onMiss?.(key, why);
    this.remove(key); // a roster that cannot be used only costs space and reads
    return null;
  }

  private remove(key: CacheKey): void {
    this.storage.removeItem(this.rosterName(key));
    const index = this.readIndex();
    if (delete index[this.keyText(key)]) this.writeIndex(index);
  }

  /** Oldest whole rosters out until the global limits hold (index only: no payload read). */
  private evict(index: Record<string, IndexEntry>, keep: CacheKey): void {
    const total = (): number => Object.values(index).reduce((n, e) => n + e.payloadBytes, 0);
    while (Object.keys(index).length > this.limits.maxGroups || total() > this.limits.maxTotalBytes) {
      if (!this.evictOldest(index, keep)) return;
    }
  }

  private evictOldest(index: Record<string, IndexEntry>, keep: CacheKey): boolean {
    const keepText = this.keyText(keep);
    let oldest: string | null = null;
    for (const [text, entry] of Object.entries(index)) {
      if (text === keepText) continue;
      if (oldest === null || entry.cachedAtMs < (index[oldest]?.cachedAtMs ?? Infinity)) oldest = text;
    }
    if (oldest === null) return false;
    delete index[oldest];
    this.storage.removeItem(`${this.prefix}roster:${oldest}`);
    this.writeIndex(index);
    return true;
  }

  private async sign(key: CacheKey, cachedAt: number, rows: ReadonlyArray<readonly [string, string]>): Promise<string> {
    const crypto = subtle();
    const parts: Uint8Array[] = [];
    for (const [userId, payload] of rows) {
      // Length-prefixed, so no two different row lists hash the same (the host's digest).
      for (const part of [userId, payload]) {
        const data = utf8.encode(part);
        parts.push(lengthPrefix(data.length), data);
      }
    }
    const digest = new Uint8Array(await crypto.digest("SHA-256", concat(parts)));
    const header = utf8.encode(asciiJson([FORMAT_VERSION, key.environment, key.account, key.group, cachedAt, rows.length]));
    if (this.hmacKey === null) {
      this.hmacKey = crypto.importKey("raw", this.keyBytes, { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
    }
    return hex(await crypto.sign("HMAC", await this.hmacKey, concat([header, digest])));
  }
}
