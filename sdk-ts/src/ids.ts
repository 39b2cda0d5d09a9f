// Ids towards clients are decimal strings (docs/contract.md §9): a JavaScript number cannot hold
// a u64 (11982011376358104761 would read 11982011376358105000). Versions, sequence numbers and
// counts stay numbers, each checked to be a safe integer before it is compared.

/** A u64 user id as its canonical decimal string. */
export type UserId = string;
/** A member's identity in a group (today: the member's user id, an opaque string to callers). */
export type MemberRef = string;

const U64_PATTERN = /^(0|[1-9][0-9]{0,19})$/;
const U64_MAX = 18446744073709551615n;

/** Whether `value` is a u64 written the canonical way (no sign, space or leading zero). */
export function isUserId(value: unknown): value is UserId {
  return typeof value === "string" && U64_PATTERN.test(value) && BigInt(value) <= U64_MAX;
}

/** The id as the API accepts it; a number is refused (it may already have lost digits). */
export function userId(value: unknown, what = "user id"): UserId {
  if (!isUserId(value)) {
    throw new TypeError(`${what} must be a u64 as a decimal string, got ${JSON.stringify(value)}`);
  }
  return value;
}

/** Numeric order of two ids (a string compare would put "10" before "9"). */
export function compareUserIds(a: UserId, b: UserId): number {
  if (a.length !== b.length) return a.length - b.length;
  return a < b ? -1 : a > b ? 1 : 0;
}

/** A non-negative safe integer (a count or a version a JavaScript number holds exactly). */
export function isSafeCount(value: unknown): value is number {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0;
}
