// The member cache's record format (seed 004 "本地缓存"), shared by the host's SQLite cache
// (host/sqlite-cache.ts, the Python host's app/members/cache.py format) and the browser's
// WebStorageMemberCache (web-cache.ts): format version 1, whitelisted display fields only, one
// compact JSON payload per member (keys sorted), the limits and the 14-day expiry. No Node API.

import { isSafeCount, isUserId } from "./ids.js";
import type { StoreMember } from "./store.js";

export const FORMAT_VERSION = 1;
export const DAY_MS = 86_400_000;
/** A cached_at this far ahead is a corrupt header. */
export const FUTURE_TOLERANCE_MS = DAY_MS;

/** The display fields a cached member may carry, and nothing else (sorted: the payload's key order). */
export const FIELDS = [
  "avatar_url", "display_name", "joined_at", "left_at", "mention_count", "record_count",
  "remark", "role", "state", "stats_known", "user_id",
] as const;
const FIELD_SET: ReadonlySet<string> = new Set(FIELDS);

export interface CacheLimits {
  readonly maxGroups: number;
  readonly maxTotalBytes: number;
  readonly maxGroupMembers: number;
  readonly maxGroupBytes: number;
  readonly expiryMs: number;
}

export const DEFAULT_LIMITS: CacheLimits = {
  maxGroups: 100,
  maxTotalBytes: 32 * 1024 * 1024,
  maxGroupMembers: 20_000,
  maxGroupBytes: 4_000_000,
  expiryMs: 14 * DAY_MS,
};

/** JSON as Python's json.dumps(separators=(",", ":")) writes it (non-ASCII escaped). */
export function asciiJson(value: unknown): string {
  return JSON.stringify(value).replace(/[\u0080-\uffff]/g, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));
}

/** A member's cache payload: the whitelisted fields, keys sorted, compact (the Python host's too). */
export function encode(member: StoreMember): string {
  const payload: Record<(typeof FIELDS)[number], unknown> = {
    avatar_url: member.avatarUrl,
    display_name: member.displayName,
    joined_at: member.joinedAt,
    left_at: member.leftAt,
    mention_count: member.mentionCount,
    record_count: member.recordCount,
    remark: member.remark,
    role: member.role,
    state: member.state,
    stats_known: member.statsKnown,
    user_id: member.userId,
  };
  return JSON.stringify(payload);
}

/** A member from a cached payload, or null when the payload is not exactly format 1's. */
export function decode(payload: string): StoreMember | null {
  let data: unknown;
  try {
    data = JSON.parse(payload);
  } catch {
    return null;
  }
  if (typeof data !== "object" || data === null || Array.isArray(data)) return null;
  const d = data as Record<string, unknown>;
  const keys = Object.keys(d);
  if (keys.length !== FIELD_SET.size || !keys.every((k) => FIELD_SET.has(k))) return null;
  if (!isUserId(d["user_id"])) return null;
  for (const name of ["display_name", "remark", "avatar_url"]) if (d[name] !== null && typeof d[name] !== "string") return null;
  for (const name of ["joined_at", "left_at"]) if (d[name] !== null && !isSafeCount(d[name])) return null;
  const role = d["role"];
  const state = d["state"];
  if ((role !== "owner" && role !== "admin" && role !== "member") || (state !== "active" && state !== "left" && state !== "removed")) return null;
  const known = d["stats_known"] === true && isSafeCount(d["record_count"]) && isSafeCount(d["mention_count"]);
  const displayName = d["display_name"] as string | null;
  return Object.freeze({
    memberRef: d["user_id"],
    userId: d["user_id"],
    role,
    state,
    joinedAt: d["joined_at"] as number | null,
    leftAt: d["left_at"] as number | null,
    displayName,
    remark: d["remark"] as string | null,
    avatarUrl: d["avatar_url"] as string | null,
    recordCount: known ? (d["record_count"] as number) : null,
    mentionCount: known ? (d["mention_count"] as number) : null,
    statsKnown: known,
    profileFailed: false,
    presented: displayName !== null || known,
  });
}
