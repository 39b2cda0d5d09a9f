// The host side's member cache (seed 004 "本地缓存"): SQLite, signed, bounded. The same rules and
// the same on-disk format as the Python host's app/members/cache.py:
//
// * Format version 1 only: a roster of another format is a miss, never read "as best we can".
// * Whitelisted display fields only (FIELDS): a payload with any other key is corrupt, a miss.
// * Signed: HMAC-SHA256 over (format, environment, account, group, cached_at, member count, a
//   digest of every row) under the runtime key. A roster copied from another account/group,
//   edited on disk or written under a previous runtime key is a miss.
// * Bounded without reading payloads: each row stores payload_bytes and each roster its total,
//   so capacity is a SUM over headers. 100 rosters and 32 MiB in all, 20,000 members / 4 MB
//   per roster, 14-day expiry. A roster over its own limit is not cached at all; over the global
//   limits the oldest WHOLE rosters go (a truncated roster would pass for complete).
// * Failures are misses: a read error is null, a failed write returns false.
// * Generation-checked writes: `stillCurrent()` is asked inside the write transaction, so a write
//   started before a 2001/2002 clear never lands after it.
//
// The database is passed in (a better-sqlite3 Database, or anything with its exec/prepare
// shape): the SDK has no native dependency, and a host keeps one connection for all its caches.
// Node only (node:crypto); import it from "@session-projector/sdk/host".

import { createHash, createHmac, timingSafeEqual } from "node:crypto";

import { DEFAULT_LIMITS, FORMAT_VERSION, FUTURE_TOLERANCE_MS, asciiJson, encode, decode, type CacheLimits } from "../cache-format.js";
import type { CacheKey, CachedRoster, MemberCache, StoreMember } from "../store.js";
import type { CallOptions } from "../http.js";

/** What the cache uses of a SQLite connection (better-sqlite3's Database has it). */
export interface SqliteDatabaseLike {
  exec(sql: string): unknown;
  prepare(sql: string): SqliteStatementLike;
}

export interface SqliteStatementLike {
  run(...params: unknown[]): unknown;
  get(...params: unknown[]): unknown;
  all(...params: unknown[]): unknown[];
}

export interface SqliteMemberCacheOptions {
  /** Milliseconds since the epoch (Date.now by default). */
  now?: () => number;
  limits?: Partial<CacheLimits>;
  /** Told why a roster was a miss (logs, tests). */
  onMiss?: (key: CacheKey, why: string) => void;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS member_rosters (
    environment TEXT NOT NULL,
    account TEXT NOT NULL,
    group_id TEXT NOT NULL,
    format_version INTEGER NOT NULL,
    cached_at_ms INTEGER NOT NULL,
    member_count INTEGER NOT NULL,
    payload_bytes INTEGER NOT NULL,
    signature BLOB NOT NULL,
    PRIMARY KEY (environment, account, group_id)
);
CREATE TABLE IF NOT EXISTS member_rows (
    environment TEXT NOT NULL,
    account TEXT NOT NULL,
    group_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    user_id TEXT NOT NULL,
    payload TEXT NOT NULL,
    payload_bytes INTEGER NOT NULL,
    PRIMARY KEY (environment, account, group_id, position)
);
`;

interface Header {
  format_version: number;
  cached_at_ms: number;
  member_count: number;
  payload_bytes: number;
  signature: Uint8Array;
}

interface Row {
  user_id: string;
  payload: string;
  payload_bytes: number;
}

/** Member rosters on disk, keyed by (environment, account, group). Implements MemberCache. */
export class SqliteMemberCache implements MemberCache {
  readonly limits: CacheLimits;
  private readonly db: SqliteDatabaseLike;
  private readonly key: Buffer;
  private readonly now: () => number;
  private readonly onMiss: ((key: CacheKey, why: string) => void) | undefined;
  private ready = false;

  constructor(db: SqliteDatabaseLike, signingKey: Uint8Array | string, options: SqliteMemberCacheOptions = {}) {
    const key = typeof signingKey === "string" ? Buffer.from(signingKey, "utf8") : Buffer.from(signingKey);
    if (key.length < 16) throw new RangeError("the cache signing key must be at least 16 bytes");
    this.db = db;
    this.key = key;
    this.now = options.now ?? Date.now;
    this.limits = { ...DEFAULT_LIMITS, ...(options.limits ?? {}) };
    this.onMiss = options.onMiss;
  }

  /** The cached roster, or null on any kind of miss (absent, expired, corrupt, other format,
   * bad signature, SQLite failure). */
  async load(key: CacheKey, options: CallOptions = {}): Promise<CachedRoster | null> {
    options.signal?.throwIfAborted();
    try {
      return this.loadNow(key, this.now());
    } catch (error) {
      this.onMiss?.(key, `read failed: ${(error as Error)?.message ?? String(error)}`);
      return null;
    }
  }

  /** Write a whole roster, replacing the previous one. False when not written: over one
   * roster's limits, no longer current, or a SQLite failure. */
  async store(key: CacheKey, members: readonly StoreMember[], stillCurrent: () => boolean = () => true): Promise<boolean> {
    const rows = [...members]
      .sort((a, b) => (a.userId.length - b.userId.length) || (a.userId < b.userId ? -1 : a.userId > b.userId ? 1 : 0))
      .map((m) => ({ user_id: m.userId, payload: encode(m) }));
    try {
      return this.storeNow(key, rows, this.now(), stillCurrent);
    } catch {
      return false;
    }
  }

  async delete(key: CacheKey): Promise<void> {
    try {
      this.deleteNow(key);
    } catch {
      /* a failed delete leaves a roster the next load verifies anyway */
    }
  }

  /** (rosters, payload bytes) on disk, from the headers alone. */
  usage(): { rosters: number; bytes: number } {
    const row = this.conn().prepare("SELECT COUNT(*) AS n, COALESCE(SUM(payload_bytes), 0) AS b FROM member_rosters").get() as { n: number; b: number };
    return { rosters: Number(row.n), bytes: Number(row.b) };
  }

  // -- synchronous core ------------------------------------------------------------------------

  private conn(): SqliteDatabaseLike {
    if (!this.ready) {
      this.db.exec(SCHEMA);
      this.ready = true;
    }
    return this.db;
  }

  private loadNow(key: CacheKey, now: number): CachedRoster | null {
    const db = this.conn();
    const k = [key.environment, key.account, key.group];
    const header = db
      .prepare("SELECT format_version, cached_at_ms, member_count, payload_bytes, signature FROM member_rosters WHERE environment = ? AND account = ? AND group_id = ?")
      .get(...k) as Header | undefined;
    if (header === undefined) return null;
    if (header.format_version !== FORMAT_VERSION) return this.miss(key, `format version ${header.format_version}`);
    if (header.cached_at_ms > now + FUTURE_TOLERANCE_MS) return this.miss(key, "cached_at in the future");
    if (now - header.cached_at_ms > this.limits.expiryMs) return this.miss(key, "expired");
    const rows = db
      .prepare("SELECT user_id, payload, payload_bytes FROM member_rows WHERE environment = ? AND account = ? AND group_id = ? ORDER BY position")
      .all(...k) as Row[];
    if (rows.length !== header.member_count || rows.reduce((n, r) => n + r.payload_bytes, 0) !== header.payload_bytes) {
      return this.miss(key, "row count/bytes disagree with the header");
    }
    const expected = this.sign(key, header.cached_at_ms, rows);
    const signature = header.signature;
    if (!(signature instanceof Uint8Array) || signature.length !== expected.length || !timingSafeEqual(expected, signature)) {
      return this.miss(key, "bad signature");
    }
    const members: StoreMember[] = [];
    for (const row of rows) {
      const member = decode(row.payload);
      if (member === null || member.userId !== row.user_id || Buffer.byteLength(row.payload, "utf8") !== row.payload_bytes) {
        return this.miss(key, `corrupt row for user ${row.user_id}`);
      }
      members.push(member);
    }
    return { members, cachedAtMillis: header.cached_at_ms };
  }

  private miss(key: CacheKey, why: string): null {
    // A roster that cannot be used is deleted at once: it would only cost space and reads.
    this.onMiss?.(key, why);
    this.deleteNow(key);
    return null;
  }

  private storeNow(key: CacheKey, rows: Array<{ user_id: string; payload: string }>, now: number, stillCurrent: () => boolean): boolean {
    const sizes = rows.map((r) => Buffer.byteLength(r.payload, "utf8"));
    const total = sizes.reduce((n, s) => n + s, 0);
    if (rows.length > this.limits.maxGroupMembers || total > this.limits.maxGroupBytes) {
      // Never a truncated roster; and the older copy is now known to be out of date.
      this.deleteNow(key);
      return false;
    }
    const signature = this.sign(key, now, rows);
    const k = [key.environment, key.account, key.group];
    const db = this.conn();
    db.exec("BEGIN IMMEDIATE");
    try {
      if (!stillCurrent()) {
        db.exec("ROLLBACK");
        return false;
      }
      this.deleteRows(key);
      db.prepare(
        "INSERT INTO member_rosters (environment, account, group_id, format_version, cached_at_ms, member_count, payload_bytes, signature) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
      ).run(...k, FORMAT_VERSION, now, rows.length, total, signature);
      const insert = db.prepare(
        "INSERT INTO member_rows (environment, account, group_id, position, user_id, payload, payload_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
      );
      rows.forEach((row, position) => insert.run(...k, position, row.user_id, row.payload, sizes[position]));
      this.evict(key);
      db.exec("COMMIT");
    } catch (error) {
      db.exec("ROLLBACK");
      throw error;
    }
    return true;
  }

  /** Oldest whole rosters out until the global limits hold (headers only: no payload read). */
  private evict(keep: CacheKey): void {
    const db = this.conn();
    for (;;) {
      const { n, b } = db.prepare("SELECT COUNT(*) AS n, COALESCE(SUM(payload_bytes), 0) AS b FROM member_rosters").get() as { n: number; b: number };
      if (n <= this.limits.maxGroups && b <= this.limits.maxTotalBytes) return;
      const oldest = db
        .prepare("SELECT environment, account, group_id FROM member_rosters WHERE NOT (environment = ? AND account = ? AND group_id = ?) ORDER BY cached_at_ms ASC LIMIT 1")
        .get(keep.environment, keep.account, keep.group) as { environment: string; account: string; group_id: string } | undefined;
      if (oldest === undefined) return; // only the new roster is left, within its own limits
      this.deleteRows({ environment: oldest.environment, account: oldest.account, group: oldest.group_id });
    }
  }

  private deleteNow(key: CacheKey): void {
    const db = this.conn();
    db.exec("BEGIN IMMEDIATE");
    try {
      this.deleteRows(key);
      db.exec("COMMIT");
    } catch (error) {
      db.exec("ROLLBACK");
      throw error;
    }
  }

  private deleteRows(key: CacheKey): void {
    const db = this.conn();
    const k = [key.environment, key.account, key.group];
    db.prepare("DELETE FROM member_rosters WHERE environment = ? AND account = ? AND group_id = ?").run(...k);
    db.prepare("DELETE FROM member_rows WHERE environment = ? AND account = ? AND group_id = ?").run(...k);
  }

  private sign(key: CacheKey, cachedAt: number, rows: ReadonlyArray<{ user_id: string; payload: string }>): Buffer {
    const digest = createHash("sha256");
    for (const row of rows) {
      // Length-prefixed, so no two different row lists hash the same.
      for (const part of [row.user_id, row.payload]) {
        const data = Buffer.from(part, "utf8");
        const length = Buffer.alloc(8);
        length.writeBigUInt64BE(BigInt(data.length));
        digest.update(length);
        digest.update(data);
      }
    }
    const header = asciiJson([FORMAT_VERSION, key.environment, key.account, key.group, cachedAt, rows.length]);
    return createHmac("sha256", this.key).update(Buffer.concat([Buffer.from(header, "utf8"), digest.digest()])).digest();
  }
}

export { DAY_MS, DEFAULT_LIMITS, FIELDS, FORMAT_VERSION, decode, encode, type CacheLimits } from "../cache-format.js";
