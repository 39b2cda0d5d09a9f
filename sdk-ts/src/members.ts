// The member directory's HTTP calls (docs/contract.md §8, seed 004): capability probe, keyset
// pages, presentation of 1..50 members with statistics and the caller's own remarks, setting
// and clearing a remark, read receipts. Every call takes an
// AbortSignal. Errors are classified once (errors.ts): 2001/2002 only from the access codes, a
// backend without the paging API is a MemberApiMissingError, never a fallback to a full read.

import type { Profile } from "./store.js";
import {
  CONVERSATION_DISABLED,
  MemberAccessDeniedError,
  MemberApiMissingError,
  NOT_A_MEMBER,
  ProtocolError,
  RequestError,
  UnavailableError,
} from "./errors.js";
import { HttpClient, isObject, readJson, type CallOptions, type ClientOptions, type ResponseLike } from "./http.js";
import { isSafeCount, isUserId, type MemberRef, type UserId } from "./ids.js";

export type Role = "owner" | "admin" | "member";
export type MemberState = "active" | "left" | "removed";

export const PAGE_LIMIT_DEFAULT = 50;
export const PAGE_LIMIT_MAX = 100;
export const PRESENTATION_MAX = 50;
export const READERS_LIMIT_MAX = 500;
/** A remark (备注) is 1..64 characters after trimming, without control characters (server rule). */
export const REMARK_MAX_CHARS = 64;

/** One roster row: the member's identity and membership, no presentation. */
export interface BaseMember {
  readonly memberRef: MemberRef;
  readonly userId: UserId;
  readonly role: Role;
  readonly state: MemberState;
  readonly joinedAt: number | null;
  readonly leftAt: number | null;
}

export interface MemberPage {
  readonly items: readonly BaseMember[];
  readonly hasMore: boolean;
  /** The reference of the next page (opaque: pass it back as `after`); null at the end. */
  readonly next: string | null;
  /** The caller's role from this page's access check (never from a cache). */
  readonly selfRole: string;
  /** What the caller may administer, from the group's settings and this page's role (seed 004:
   * the admin entry comes only from group.settings, never from a cached role). */
  readonly adminCapabilities?: Readonly<Record<string, boolean>>;
  /** The join events of this page's members; merge them across pages with `mergeJoinEvents`. */
  readonly joinEvents?: readonly JoinEvent[];
}

/** Members who joined with one event (same position); the same event spans pages. */
export interface JoinEvent {
  readonly eventRef: string;
  readonly joinedAt: number;
  readonly invitees: readonly MemberRef[];
}

/** `known` with a page's join events merged in: one event per eventRef, invitees merged by
 * memberRef (never by name); an event whose invitees did not change keeps its object. */
export function mergeJoinEvents(
  known: ReadonlyMap<string, JoinEvent>,
  page: readonly JoinEvent[],
): Map<string, JoinEvent> {
  const out = new Map(known);
  for (const event of page) {
    const old = out.get(event.eventRef);
    if (old === undefined) {
      out.set(event.eventRef, event);
      continue;
    }
    const merged = [...new Set([...old.invitees, ...event.invitees])];
    if (merged.length !== old.invitees.length) out.set(event.eventRef, { ...old, invitees: merged });
  }
  return out;
}

export interface PresentedMember extends BaseMember {
  /** Null when unknown (late, failed or invalid statistics): never shown as 0. */
  readonly recordCount: number | null;
  readonly mentionCount: number | null;
  /** Both statistics are non-negative safe integers. */
  readonly statsKnown: boolean;
  /** The CALLER's own remark (备注) on this member, null for none. Meaningful only when the
   * result's `remarksIncluded`: then it is the server's word (null or absent clears a known
   * remark). Optional so that a MemberSource written before remarks still type-checks. */
  readonly remark?: string | null;
}

export interface PresentationResult {
  /** The members found, active or not (state says which). */
  readonly items: readonly PresentedMember[];
  /** Refs the server does not know as members of the group at all. */
  readonly missingRefs: readonly MemberRef[];
  readonly statsIncluded: boolean;
  /** The server read the caller's remarks for this answer. False (late, failed, or an older
   * server; absent: a MemberSource that knows no remarks): every `remark` is null and says
   * nothing; keep the remarks already known. */
  readonly remarksIncluded?: boolean;
  readonly selfRole: string;
}

export interface RemarkRequest extends CallOptions {
  /** The member the remark is about (not the caller). */
  memberRef: MemberRef;
}

export interface ReaderDetail {
  readonly memberRef: MemberRef;
  readonly role: Role;
  readonly readConversationSeq: number;
}

export interface ReadReceipts {
  readonly conversationSeq: number;
  readonly senderId: UserId | null;
  readonly readRefs: readonly MemberRef[];
  readonly unreadRefs: readonly MemberRef[];
  readonly readCount: number;
  readonly unreadCount: number;
  readonly basicOnly: boolean;
  readonly selfRole: string;
  /** Present unless basicOnly: what the server knows of each member (profiles come from the store). */
  readonly read?: readonly ReaderDetail[];
  readonly unread?: readonly ReaderDetail[];
  /** More members to examine: pass `next` back as `pageRef` (opaque; null at the end). */
  readonly hasMore?: boolean;
  readonly next?: string | null;
}

/** What the backend serves (from its /openapi.json). */
export interface Capabilities {
  readonly membersPage: boolean;
  readonly presentation: boolean;
  readonly readReceipts: boolean;
  readonly liveStream: boolean;
}

export interface PageRequest extends CallOptions {
  group: string;
  /** The previous page's `next` (absent: the first page). */
  after?: string | null;
  limit?: number;
  activeOnly?: boolean;
}

export interface PresentationRequest extends CallOptions {
  group: string;
  memberRefs: readonly MemberRef[];
  /** Default true (seed 004: presentation always asks for statistics). */
  includeStats?: boolean;
}

export interface ReadReceiptsRequest extends CallOptions {
  group: string;
  conversationSeq: number;
  basicOnly?: boolean;
  /** Active members examined per page (server default 100, at most 500). */
  limit?: number;
  /** The previous answer's `next`. */
  pageRef?: string | null;
}

/** Removed or departed: the refs a presentation/verification answer confirms are gone. */
export function removedRefs(result: PresentationResult): Set<MemberRef> {
  const gone = new Set<MemberRef>(result.missingRefs);
  for (const item of result.items) if (item.state !== "active") gone.add(item.memberRef);
  return gone;
}

const ROLES: ReadonlySet<string> = new Set(["owner", "admin", "member"]);
const STATES: ReadonlySet<string> = new Set(["active", "left", "removed"]);

function optSeq(value: unknown, what: string): number | null {
  if (value === null || value === undefined) return null;
  if (!isSafeCount(value)) throw new ProtocolError(`${what} must be null or a safe integer`);
  return value;
}

function refOf(value: unknown, what: string): MemberRef {
  if (!isUserId(value)) throw new ProtocolError(`${what} must be a u64 as a decimal string, got ${JSON.stringify(value)}`);
  return value;
}

export function parseBaseMember(item: unknown): BaseMember {
  if (!isObject(item)) throw new ProtocolError("a member must be an object");
  const id = refOf(item["user_id"], "user_id");
  const role = item["role"] ?? "member";
  const state = item["state"] ?? "active";
  if (typeof role !== "string" || !ROLES.has(role)) throw new ProtocolError(`member ${id}: unknown role ${String(role)}`);
  if (typeof state !== "string" || !STATES.has(state)) throw new ProtocolError(`member ${id}: unknown state ${String(state)}`);
  return {
    memberRef: id,
    userId: id,
    role: role as Role,
    state: state as MemberState,
    joinedAt: optSeq(item["joined_at_conversation_seq"], "joined_at_conversation_seq"),
    leftAt: optSeq(item["left_at_conversation_seq"], "left_at_conversation_seq"),
  };
}

export function parsePage(body: Record<string, unknown>): MemberPage {
  const items = body["items"];
  if (!Array.isArray(items)) throw new ProtocolError("page without items");
  const hasMore = body["has_more"];
  if (typeof hasMore !== "boolean") throw new ProtocolError("page: has_more must be a boolean");
  // An opaque page reference the server signed and bound to the account, group and walk.
  const ref = body["next_page_ref"] ?? null;
  if (ref !== null && typeof ref !== "string") throw new ProtocolError("page: the next page reference must be a string");
  if (hasMore && ref === null) throw new ProtocolError("page: has_more without a next page reference");
  return {
    items: items.map(parseBaseMember),
    hasMore,
    next: hasMore ? ref : null,
    selfRole: typeof body["self_role"] === "string" ? body["self_role"] : "member",
    adminCapabilities: parseAdminCapabilities(body["capabilities"]),
    joinEvents: parseJoinEvents(body["join_events"]),
  };
}

function parseAdminCapabilities(value: unknown): Readonly<Record<string, boolean>> {
  if (value === undefined || value === null) return {};
  if (!isObject(value)) throw new ProtocolError("page: capabilities must be an object");
  const out: Record<string, boolean> = {};
  for (const [name, allowed] of Object.entries(value)) out[name] = allowed === true; // only true grants
  return out;
}

function parseJoinEvents(value: unknown): JoinEvent[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw new ProtocolError("page: join_events must be a list");
  return value.map((event: unknown) => {
    if (!isObject(event) || typeof event["event_ref"] !== "string") throw new ProtocolError("page: a join event needs an event_ref");
    const invitees = event["invitee_refs"];
    if (!Array.isArray(invitees)) throw new ProtocolError("page: a join event needs invitee_refs");
    const joinedAt = event["joined_at_conversation_seq"];
    if (!isSafeCount(joinedAt)) throw new ProtocolError("page: joined_at_conversation_seq must be a safe integer");
    return { eventRef: event["event_ref"], joinedAt, invitees: invitees.map((u: unknown) => refOf(u, "invitee_refs[]")) };
  });
}

export function parsePresentation(body: Record<string, unknown>): PresentationResult {
  const items = body["items"];
  if (!Array.isArray(items)) throw new ProtocolError("presentation without items");
  const statsIncluded = body["stats_included"] === true;
  const remarksIncluded = body["remarks_included"] === true;
  const missing = body["missing_user_ids"] ?? [];
  if (!Array.isArray(missing)) throw new ProtocolError("missing_user_ids must be a list");
  return {
    items: items.map((item: unknown) => {
      const base = parseBaseMember(item);
      const record = (item as Record<string, unknown>)["record_count"];
      const mention = (item as Record<string, unknown>)["mention_count"];
      // Only two non-negative safe integers are known statistics; one bad value makes both
      // unknown (a row never shows a fake zero).
      const known = statsIncluded && isSafeCount(record) && isSafeCount(mention);
      return {
        ...base,
        recordCount: known ? (record as number) : null,
        mentionCount: known ? (mention as number) : null,
        statsKnown: known,
        remark: remarksIncluded ? parseRemark((item as Record<string, unknown>)["remark"], base.memberRef) : null,
      };
    }),
    missingRefs: missing.map((u: unknown) => refOf(u, "missing_user_ids[]")),
    statsIncluded,
    remarksIncluded,
    selfRole: typeof body["self_role"] === "string" ? body["self_role"] : "member",
  };
}

function parseRemark(value: unknown, ref: MemberRef): string | null {
  // With remarks_included every item carries one: a string, or null for none. Anything else is a
  // server this SDK does not understand, not "no remark" (that would clear a known one).
  if (value === null) return null;
  if (typeof value !== "string") throw new ProtocolError(`member ${ref}: remark must be a string or null`);
  return value;
}

function parseStoredRemark(body: Record<string, unknown>): string | null {
  const remark = body["remark"];
  if (remark !== null && typeof remark !== "string") throw new ProtocolError("remark answer: remark must be a string or null");
  return remark;
}

function parseReaders(body: Record<string, unknown>): ReadReceipts {
  const list = (key: string): MemberRef[] => {
    const v = body[key];
    if (!Array.isArray(v)) throw new ProtocolError(`${key} must be a list`);
    return v.map((u: unknown) => refOf(u, `${key}[]`));
  };
  const detail = (key: string): ReaderDetail[] | undefined => {
    const v = body[key];
    if (v === undefined) return undefined;
    if (!Array.isArray(v)) throw new ProtocolError(`${key} must be a list`);
    return v.map((d: unknown) => {
      const base = parseBaseMember(d);
      const seq = isObject(d) ? d["read_conversation_seq"] : undefined;
      return { memberRef: base.memberRef, role: base.role, readConversationSeq: isSafeCount(seq) ? seq : 0 };
    });
  };
  const count = (key: string): number => {
    const v = body[key];
    if (!isSafeCount(v)) throw new ProtocolError(`${key} must be a safe integer`);
    return v;
  };
  const sender = body["sender_id"];
  const read = detail("read");
  const unread = detail("unread");
  return {
    conversationSeq: count("conversation_seq"),
    senderId: sender === null || sender === undefined ? null : refOf(sender, "sender_id"),
    readRefs: list("read_user_ids"),
    unreadRefs: list("unread_user_ids"),
    readCount: count("read_count"),
    unreadCount: count("unread_count"),
    basicOnly: body["basic_only"] === true,
    selfRole: typeof body["self_role"] === "string" ? body["self_role"] : "member",
    hasMore: body["has_more"] === true,
    next: body["has_more"] === true && typeof body["next_page_ref"] === "string" ? body["next_page_ref"] : null,
    ...(read !== undefined ? { read } : {}),
    ...(unread !== undefined ? { unread } : {}),
  };
}

/** The one place an HTTP answer of the member API becomes an error (the store acts on the class). */
export function classifyMemberError(status: number, payload: unknown, operation: string): Error {
  const error = isObject(payload) && isObject(payload["error"]) ? payload["error"] : null;
  const rawCode = error?.["code"];
  const code = typeof rawCode === "string" || typeof rawCode === "number" ? String(rawCode) : "";
  const message = typeof error?.["message"] === "string" ? error["message"] : "";
  if (code === NOT_A_MEMBER || code === CONVERSATION_DISABLED) return new MemberAccessDeniedError(code, message);
  // The router's own answers: no such route (404 not_found) or method (405) on this backend.
  if ((status === 404 && (code === "not_found" || error === null)) || status === 405 || status === 501) {
    return new MemberApiMissingError(operation, status, message);
  }
  if (status >= 500 || status === 408 || status === 429) return new UnavailableError(`${operation}: HTTP ${status} ${message}`.trim(), status);
  return new RequestError(status, code || "?", message);
}

/** The member directory's HTTP calls. Implements MemberSource for the member store. */
export class MembersClient {
  readonly http: HttpClient;

  constructor(options: ClientOptions | HttpClient) {
    this.http = options instanceof HttpClient ? options : new HttpClient(options);
  }

  /** What this backend serves, from its description (/openapi.json; public on this API, the
   * token goes along for a gateway in front that authenticates every path). A backend with no
   * description at that address serves none of these. */
  async probe(options: CallOptions = {}): Promise<Capabilities> {
    const response = await this.http.send("GET", "/openapi.json", { signal: options.signal });
    const payload = await readJson(response, options.signal);
    if (response.status === 404 || response.status === 405) {
      return { membersPage: false, presentation: false, readReceipts: false, liveStream: false };
    }
    if (response.status !== 200 || !isObject(payload)) {
      throw new UnavailableError(`capability probe: HTTP ${response.status}`, response.status);
    }
    const operations = new Set<string>();
    const paths = isObject(payload["paths"]) ? payload["paths"] : {};
    for (const item of Object.values(paths)) {
      if (!isObject(item)) continue;
      for (const op of Object.values(item)) {
        if (isObject(op) && typeof op["operationId"] === "string") operations.add(op["operationId"]);
      }
    }
    return {
      membersPage: operations.has("membersPage"),
      presentation: operations.has("membersByUserIds"),
      readReceipts: operations.has("messageReaders"),
      liveStream: "/v1/stream" in paths,
    };
  }

  /** One keyset page of the group's roster (default 50, at most 100). */
  async page(request: PageRequest): Promise<MemberPage> {
    const limit = request.limit ?? PAGE_LIMIT_DEFAULT;
    if (!Number.isInteger(limit) || limit < 1 || limit > PAGE_LIMIT_MAX) {
      throw new RangeError(`limit must be an integer from 1 to ${PAGE_LIMIT_MAX}`);
    }
    const body: Record<string, unknown> = { chat_session_uid: request.group, limit, active_only: request.activeOnly ?? true };
    if (request.after !== undefined && request.after !== null) body["page_ref"] = request.after;
    return parsePage(await this.post("/api/v1/chats/members/page", body, "members page", request.signal));
  }

  /** 1..50 members by reference, active or not, with statistics (when ready within 2 s). */
  async presentation(request: PresentationRequest): Promise<PresentationResult> {
    const refs = request.memberRefs;
    if (refs.length < 1 || refs.length > PRESENTATION_MAX) {
      throw new RangeError(`memberRefs must hold 1 to ${PRESENTATION_MAX} members`);
    }
    const body = { chat_session_uid: request.group, user_ids: [...refs], include_stats: request.includeStats ?? true };
    return parsePresentation(await this.post("/api/v1/chats/members/by-user-ids", body, "members presentation", request.signal));
  }

  /** Who of the active members has read up to a message (basicOnly: ids and counts only). */
  async readReceipts(request: ReadReceiptsRequest): Promise<ReadReceipts> {
    if (!Number.isSafeInteger(request.conversationSeq) || request.conversationSeq < 1) {
      throw new RangeError("conversationSeq must be a positive safe integer");
    }
    const group = encodeURIComponent(request.group);
    const params = new URLSearchParams();
    if (request.basicOnly) params.set("basic_only", "true");
    if (request.limit !== undefined) {
      if (!Number.isInteger(request.limit) || request.limit < 1 || request.limit > READERS_LIMIT_MAX) {
        throw new RangeError(`limit must be an integer from 1 to ${READERS_LIMIT_MAX}`);
      }
      params.set("limit", String(request.limit));
    }
    if (request.pageRef !== undefined && request.pageRef !== null) params.set("page_ref", request.pageRef);
    const q = params.size > 0 ? `?${params.toString()}` : "";
    const path = `/api/v1/chats/${group}/messages/${request.conversationSeq}/readers${q}`;
    const response = await this.http.send("GET", path, { signal: request.signal });
    return parseReaders(await this.answer(response, "read receipts", request.signal));
  }

  /** Set the caller's own remark on a member (PUT /api/v1/users/{id}/remark); resolves to the
   * text the server stored (trimmed). The server refuses (RequestError, 400 "invalid_remark") an
   * empty remark, one over 64 characters, or one with control characters; and the caller's own
   * ref (400). Other devices of the caller see it with their next presentation. */
  async setRemark(request: RemarkRequest & { remark: string }): Promise<string | null> {
    const ref = refOf(request.memberRef, "memberRef");
    const response = await this.http.send("PUT", `/api/v1/users/${ref}/remark`, { body: { remark: request.remark }, signal: request.signal });
    return parseStoredRemark(await this.answer(response, "set remark", request.signal));
  }

  /** Clear the caller's own remark on a member (DELETE; none to clear is not an error). */
  async clearRemark(request: RemarkRequest): Promise<void> {
    const ref = refOf(request.memberRef, "memberRef");
    const response = await this.http.send("DELETE", `/api/v1/users/${ref}/remark`, { signal: request.signal });
    await this.answer(response, "clear remark", request.signal);
  }

  /** Public profiles of 1..50 members (POST /api/v1/users/profiles): the member store's
   * ProfileSource. A member the server has no profile for is absent (that profile failed).
   * Profiles are public: names and avatars, never a remark (that comes with `presentation`). */
  async profiles(refs: readonly MemberRef[], options: CallOptions = {}): Promise<ReadonlyMap<MemberRef, Profile>> {
    if (refs.length < 1 || refs.length > PRESENTATION_MAX) {
      throw new RangeError(`refs must hold 1 to ${PRESENTATION_MAX} members`);
    }
    const body = await this.post("/api/v1/users/profiles", { user_ids: [...refs] }, "profiles", options.signal);
    const items = body["items"];
    if (!Array.isArray(items)) throw new ProtocolError("profiles without items");
    const out = new Map<MemberRef, Profile>();
    for (const item of items) {
      if (!isObject(item)) throw new ProtocolError("a profile must be an object");
      const name = item["display_name"];
      const avatar = item["avatar_url"];
      out.set(refOf(item["user_id"], "user_id"), {
        displayName: typeof name === "string" ? name : null,
        avatarUrl: typeof avatar === "string" ? avatar : null,
      });
    }
    return out;
  }

  private async post(path: string, body: unknown, operation: string, signal: AbortSignal | undefined): Promise<Record<string, unknown>> {
    const response = await this.http.send("POST", path, { body, signal });
    return this.answer(response, operation, signal);
  }

  private async answer(response: ResponseLike, operation: string, signal: AbortSignal | undefined): Promise<Record<string, unknown>> {
    const payload = await readJson(response, signal);
    if (response.status === 200 && isObject(payload)) return payload;
    throw classifyMemberError(response.status, payload, operation);
  }
}
