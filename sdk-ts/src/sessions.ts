// The session list: pages of a per-user snapshot walked with signed cursors (docs/contract.md §5),
// the badge, and the client rule of §4 that keeps a pulled list current from SESSION_DELTA and
// BADGE_UPDATE frames: absolute rows, one version per conversation, overwrite never add, a
// broken version chain means "pull again" (a gap), never a patch. No count is ever incremented
// on this path.

import { ProtocolError, TraversalLimitError } from "./errors.js";
import { apiError, HttpClient, isObject, readJson, type CallOptions, type ClientOptions } from "./http.js";
import { isSafeCount, isUserId, type UserId } from "./ids.js";

export type Membership = "active" | "left" | "removed";
export type Folder = "main" | "archived";

/** A projection row (docs/contract.md §4), as the API and the live stream send it. */
export interface SessionRow {
  readonly user_id: UserId;
  readonly conversation_id: string;
  readonly listed: boolean;
  readonly membership: Membership;
  readonly pinned: boolean;
  readonly pin_rank: number | null;
  readonly archived: boolean;
  readonly muted: boolean;
  /** docs/contract.md §10: marked unread by the user (absent from an older server: false). */
  readonly marked_unread?: boolean;
  readonly last_activity_id: string | null;
  readonly latest_conversation_seq: number | null;
  readonly last_message_id: string | null;
  readonly unread_count: number;
  readonly unread_exact: boolean;
  readonly mention_count: number;
  readonly mention_first_conversation_seq: number | null;
  readonly read_conversation_seq: number;
  readonly hidden_before_conversation_seq: number;
  readonly deleted_before_conversation_seq: number;
  readonly joined_at_conversation_seq: number;
  readonly left_at_conversation_seq: number | null;
  readonly projection_mailbox_seq: number;
  readonly [field: string]: unknown;
}

export interface SessionPage {
  readonly items: readonly SessionRow[];
  readonly next_cursor: string | null;
  readonly snapshot_revision: number;
  readonly projection_complete: boolean;
  readonly projection_mailbox_seq: number;
  readonly folder: Folder;
  readonly filled_from_state: boolean;
  readonly truncated: boolean;
}

export type BadgeMode = "messages" | "conversations";

export interface Badge {
  readonly total_unread: number;
  readonly total_mention: number;
  readonly muted_unread: number;
  /** docs/contract.md §10: the archived folder's totals, in the same badge mode. */
  readonly archived_unread: number;
  readonly archived_mention: number;
  /** The user's badge preferences the totals are in (§10). */
  readonly badge_mode: BadgeMode;
  readonly include_muted: boolean;
  /** The projection_mailbox_seq the totals are as of. */
  readonly version: number;
}

export interface SessionDeltaFrame {
  readonly type: "SESSION_DELTA";
  readonly user_id: UserId;
  readonly projection_mailbox_seq: number;
  readonly prev_projection_mailbox_seq: number;
  readonly conversations: readonly SessionRow[];
  readonly correction?: boolean;
  readonly [field: string]: unknown;
}

export interface BadgeUpdateFrame {
  readonly type: "BADGE_UPDATE";
  readonly user_id: UserId;
  readonly total_unread: number;
  readonly total_mention: number;
  readonly muted_unread: number;
  readonly projection_mailbox_seq: number;
  readonly prev_projection_mailbox_seq?: number;
  readonly correction?: boolean;
  readonly [field: string]: unknown;
}

export type ListFrame = SessionDeltaFrame | BadgeUpdateFrame;

export type ApplyStatus = "applied" | "corrected" | "stale" | "gap" | "foreign";

export interface ApplyResult {
  readonly status: ApplyStatus;
  readonly version: number;
  /** Conversations whose row this frame overwrote. */
  readonly conversations: readonly string[];
}

function version(obj: Record<string, unknown>, key: string): number {
  const v = obj[key];
  if (!isSafeCount(v)) throw new ProtocolError(`${key} must be a non-negative safe integer, got ${JSON.stringify(v)}`);
  return v;
}

/** A Badge from a BADGE_UPDATE frame, a /v1/badge body or a hello's badge (`versionKey`: the
 * field holding its version). The §10 fields absent (an older server): 0, "messages", false;
 * present with a wrong type: a ProtocolError, like any other field. */
export function badgeOf(obj: Record<string, unknown>, versionKey = "projection_mailbox_seq"): Badge {
  const optionalCount = (key: string): number => (obj[key] === undefined ? 0 : version(obj, key));
  const mode = obj["badge_mode"] ?? "messages";
  if (mode !== "messages" && mode !== "conversations") {
    throw new ProtocolError(`badge_mode must be "messages" or "conversations", got ${JSON.stringify(mode)}`);
  }
  const includeMuted = obj["include_muted"] ?? false;
  if (typeof includeMuted !== "boolean") {
    throw new ProtocolError(`include_muted must be a boolean, got ${JSON.stringify(includeMuted)}`);
  }
  return {
    total_unread: version(obj, "total_unread"),
    total_mention: version(obj, "total_mention"),
    muted_unread: version(obj, "muted_unread"),
    archived_unread: optionalCount("archived_unread"),
    archived_mention: optionalCount("archived_mention"),
    badge_mode: mode,
    include_muted: includeMuted,
    version: version(obj, versionKey),
  };
}

/** How a count is shown (seed 000 §3.3): above 99 (or inexact), "99+". */
export function displayCount(count: number, exact = true): string {
  return !exact || count > 99 ? "99+" : String(count);
}

/** Whether a row shows as unread (§10: a row marked unread does, whatever its count). */
export function showsUnread(row: SessionRow): boolean {
  return row.unread_count > 0 || row.marked_unread === true;
}

function idOf(obj: Record<string, unknown>, key: string): UserId {
  const v = obj[key];
  if (!isUserId(v)) throw new ProtocolError(`${key} must be a u64 as a decimal string, got ${JSON.stringify(v)}`);
  return v;
}

/** Checks the fields the rule and the order read; the row is kept as sent. */
export function parseRow(value: unknown): SessionRow {
  if (!isObject(value)) throw new ProtocolError("a row must be an object");
  idOf(value, "user_id");
  if (typeof value["conversation_id"] !== "string") throw new ProtocolError("row without conversation_id");
  const rank = value["pin_rank"];
  if (rank !== null && rank !== undefined && !isSafeCount(rank)) throw new ProtocolError("pin_rank must be null or a u32");
  const activity = value["last_activity_id"];
  if (activity !== null && activity !== undefined && typeof activity !== "string") {
    throw new ProtocolError("last_activity_id must be null or a string");
  }
  version(value, "unread_count");
  version(value, "mention_count");
  const marked = value["marked_unread"];
  if (marked !== undefined && typeof marked !== "boolean") throw new ProtocolError("marked_unread must be a boolean");
  return value as SessionRow;
}

/** List order (docs/contract.md §5): pinned zone by pin_rank ASC, then last_activity_id DESC
 * (null last), then conversation_id ASC; the normal zone the same without pin_rank. */
export function compareRows(a: SessionRow, b: SessionRow): number {
  const za = a.pin_rank === null || a.pin_rank === undefined ? 1 : 0;
  const zb = b.pin_rank === null || b.pin_rank === undefined ? 1 : 0;
  if (za !== zb) return za - zb;
  if (za === 0 && a.pin_rank !== b.pin_rank) return (a.pin_rank ?? 0) - (b.pin_rank ?? 0);
  const aa = a.last_activity_id;
  const ab = b.last_activity_id;
  if (aa !== ab) {
    if (aa === null || aa === undefined) return 1;
    if (ab === null || ab === undefined) return -1;
    return aa < ab ? 1 : -1; // 32 lowercase hex chars: string order is time order
  }
  return a.conversation_id < b.conversation_id ? -1 : a.conversation_id > b.conversation_id ? 1 : 0;
}

/** One user's list with the client rule of docs/contract.md §4. */
export class SessionView {
  readonly userId: UserId;
  /** The chain position: the next SESSION_DELTA must name it as prev_projection_mailbox_seq. */
  version = 0;
  badge: Badge | null = null;
  private rows = new Map<string, SessionRow>();
  private rowVersions = new Map<string, number>();

  constructor(userId: UserId) {
    this.userId = userId;
  }

  /** Replace everything with a pulled list as of version `at`. */
  reset(rows: readonly SessionRow[], at: number, badge: Badge | null = null): void {
    if (!isSafeCount(at)) throw new ProtocolError("a list version must be a safe integer");
    this.rows = new Map();
    this.rowVersions = new Map();
    for (const row of rows) {
      this.rows.set(row.conversation_id, row);
      this.rowVersions.set(row.conversation_id, at);
    }
    this.version = at;
    if (badge !== null) this.offerBadge(badge);
  }

  /** Rows of a later page of the same walk (a snapshot at `at`): never over a newer row. */
  merge(rows: readonly SessionRow[], at: number): void {
    for (const row of rows) {
      const held = this.rowVersions.get(row.conversation_id);
      if (held !== undefined && held > at) continue;
      this.rows.set(row.conversation_id, row);
      this.rowVersions.set(row.conversation_id, at);
    }
  }

  /** A badge from a pull: taken only when newer than the one held. */
  offerBadge(badge: Badge): boolean {
    if (this.badge !== null && badge.version <= this.badge.version) return false;
    this.badge = badge;
    return true;
  }

  row(conversationId: string): SessionRow | undefined {
    return this.rows.get(conversationId);
  }

  rowVersion(conversationId: string): number | undefined {
    return this.rowVersions.get(conversationId);
  }

  /** Apply a frame; a malformed one throws ProtocolError and changes nothing. */
  apply(frame: unknown): ApplyResult {
    if (!isObject(frame)) throw new ProtocolError("a frame must be an object");
    if (frame["type"] === "SESSION_DELTA") return this.applyDelta(frame);
    if (frame["type"] === "BADGE_UPDATE") return this.applyBadge(frame);
    throw new ProtocolError(`not a list frame: ${String(frame["type"])}`);
  }

  private applyDelta(frame: Record<string, unknown>): ApplyResult {
    const v = version(frame, "projection_mailbox_seq");
    const prev = version(frame, "prev_projection_mailbox_seq");
    const list = frame["conversations"];
    if (!Array.isArray(list)) throw new ProtocolError("conversations must be a list");
    const rows = list.map(parseRow);
    if (idOf(frame, "user_id") !== this.userId) return { status: "foreign", version: v, conversations: [] };
    const changed: string[] = [];
    if (frame["correction"] === true) {
      // An audit correction restates version v: it overwrites rows held at or below v only.
      if (prev !== v) throw new ProtocolError("a correction restates its version (prev = version)");
      for (const row of rows) {
        const held = this.rowVersions.get(row.conversation_id);
        if (held !== undefined && held > v) continue;
        this.rows.set(row.conversation_id, row);
        this.rowVersions.set(row.conversation_id, v);
        changed.push(row.conversation_id);
      }
      return { status: changed.length ? "corrected" : "stale", version: v, conversations: changed };
    }
    if (prev >= v) throw new ProtocolError("prev_projection_mailbox_seq must be below projection_mailbox_seq");
    if (v <= this.version) return { status: "stale", version: v, conversations: [] };
    if (prev !== this.version) return { status: "gap", version: v, conversations: [] };
    for (const row of rows) {
      const held = this.rowVersions.get(row.conversation_id);
      if (held !== undefined && v <= held) continue;
      this.rows.set(row.conversation_id, row); // overwrite, never add
      this.rowVersions.set(row.conversation_id, v);
      changed.push(row.conversation_id);
    }
    this.version = v;
    return { status: "applied", version: v, conversations: changed };
  }

  private applyBadge(frame: Record<string, unknown>): ApplyResult {
    const v = version(frame, "projection_mailbox_seq");
    const badge: Badge = badgeOf(frame);
    if (idOf(frame, "user_id") !== this.userId) return { status: "foreign", version: v, conversations: [] };
    const held = this.badge;
    const correction = frame["correction"] === true;
    if (held !== null && (v < held.version || (v === held.version && !correction))) {
      return { status: "stale", version: v, conversations: [] };
    }
    this.badge = badge; // absolute totals: the newest is complete, no gap check
    return { status: correction ? "corrected" : "applied", version: v, conversations: [] };
  }

  /** Listed rows in list order (both folders). */
  listed(): SessionRow[] {
    return [...this.rows.values()].filter((r) => r.listed !== false).sort(compareRows);
  }

  /** The main folder in list order. */
  main(): SessionRow[] {
    return this.listed().filter((r) => r.archived !== true);
  }

  archived(): SessionRow[] {
    return this.listed().filter((r) => r.archived === true);
  }
}

/** Frames arriving within a window (100–200 ms) combined: only a conversation's older row may be
 * dropped for its newer one, and only frames contiguous in the version chain are merged (a merged
 * frame never hides a gap). Corrections pass through unmerged. */
export function mergeDeltas(frames: readonly SessionDeltaFrame[]): SessionDeltaFrame[] {
  const out: SessionDeltaFrame[] = [];
  for (const frame of frames) {
    const last = out[out.length - 1];
    if (
      last !== undefined &&
      last.correction !== true &&
      frame.correction !== true &&
      last.user_id === frame.user_id &&
      frame.prev_projection_mailbox_seq === last.projection_mailbox_seq
    ) {
      const rows = new Map<string, SessionRow>();
      for (const row of last.conversations) rows.set(row.conversation_id, row);
      for (const row of frame.conversations) rows.set(row.conversation_id, row);
      out[out.length - 1] = {
        ...frame,
        prev_projection_mailbox_seq: last.prev_projection_mailbox_seq,
        conversations: [...rows.values()],
      };
    } else {
      out.push(frame);
    }
  }
  return out;
}

export interface Walk {
  readonly rows: SessionRow[];
  readonly snapshotRevision: number;
  /** The version the walk's rows are as of. */
  readonly version: number;
  readonly pages: number;
  readonly restarts: number;
}

export interface PageOptions extends CallOptions {
  folder?: Folder;
  /** 1..100 (the server's default is 50). */
  limit?: number;
  cursor?: string | null;
}

export interface WalkOptions extends CallOptions {
  folder?: Folder;
  limit?: number;
  /** A walk restarted (projection_complete = false) more often than this throws. Default 3. */
  maxRestarts?: number;
}

/** POST /v1/reconcile's answer. */
export interface ReconcileAnswer {
  readonly accepted: boolean;
  /** Not accepted: seconds until a reconcile may be asked again. */
  readonly retryAfterS: number | null;
  /** Accepted: the next one may be asked this many seconds from now. */
  readonly minIntervalS: number | null;
}

/** The session list's HTTP calls. */
export class SessionsClient {
  readonly http: HttpClient;

  constructor(options: ClientOptions | HttpClient) {
    this.http = options instanceof HttpClient ? options : new HttpClient(options);
  }

  async page(options: PageOptions = {}): Promise<SessionPage> {
    const q = new URLSearchParams({ folder: options.folder ?? "main" });
    if (options.limit !== undefined) q.set("limit", String(options.limit));
    if (options.cursor) q.set("cursor", options.cursor);
    const body = await this.http.json("GET", `/v1/sessions?${q}`, { signal: options.signal });
    const items = body["items"];
    if (!Array.isArray(items)) throw new ProtocolError("page without items");
    const next = body["next_cursor"];
    if (next !== null && typeof next !== "string") throw new ProtocolError("next_cursor must be a string or null");
    return {
      items: items.map(parseRow),
      next_cursor: next,
      snapshot_revision: version(body, "snapshot_revision"),
      projection_complete: body["projection_complete"] === true,
      projection_mailbox_seq: version(body, "projection_mailbox_seq"),
      folder: body["folder"] === "archived" ? "archived" : "main",
      filled_from_state: body["filled_from_state"] === true,
      truncated: body["truncated"] === true,
    };
  }

  async badge(options: CallOptions = {}): Promise<Badge> {
    const body = await this.http.json("GET", "/v1/badge", options);
    return badgeOf(body);
  }

  /** POST /v1/reconcile ("fix my count", docs/contract.md §10): the worker that owns the user
   * recomputes its rows and badge and sends correction frames for what differed. Accepted (202),
   * or not within the interval since the last one (429 reconcile_too_soon: `retryAfterS` says
   * when to ask again); any other answer is an ApiError. */
  async reconcile(options: CallOptions = {}): Promise<ReconcileAnswer> {
    const response = await this.http.send("POST", "/v1/reconcile", { signal: options.signal });
    const payload = await readJson(response, options.signal);
    if (response.status === 202 && isObject(payload) && typeof payload["min_interval_s"] === "number") {
      return { accepted: true, retryAfterS: null, minIntervalS: payload["min_interval_s"] };
    }
    const error = apiError(response, payload);
    if (response.status === 429 && error.code === "reconcile_too_soon" && error.retryAfterS !== null) {
      return { accepted: false, retryAfterS: error.retryAfterS, minIntervalS: null };
    }
    throw error;
  }

  /** Every page of a folder within one snapshot revision. A cursor answered with
   * projection_complete = false is the first page of a new revision: the walk starts over from
   * it (no duplicate, no gap), at most `maxRestarts` times. */
  async walk(options: WalkOptions = {}): Promise<Walk> {
    const maxRestarts = options.maxRestarts ?? 3;
    let rows: SessionRow[] = [];
    let cursor: string | null = null;
    let pages = 0;
    let restarts = 0;
    for (;;) {
      const page: SessionPage = await this.page({ folder: options.folder ?? "main", limit: options.limit ?? 50, cursor, signal: options.signal });
      pages += 1;
      if (cursor !== null && !page.projection_complete) {
        restarts += 1;
        if (restarts > maxRestarts) {
          throw new TraversalLimitError(`the ${options.folder ?? "main"} list changed structure ${restarts} times during one walk`);
        }
        rows = [];
      }
      rows.push(...page.items);
      cursor = page.next_cursor;
      if (cursor === null) {
        return { rows, snapshotRevision: page.snapshot_revision, version: page.projection_mailbox_seq, pages, restarts };
      }
    }
  }
}

/** A user's list kept current: pulled by walks of both folders, patched by frames with the
 * client rule; a gap re-pulls. */
export class LiveSessionList implements SyncedList {
  readonly client: SessionsClient;
  readonly view: SessionView;
  readonly limit: number;
  syncs = 0;

  constructor(client: SessionsClient, userId: UserId, options: { limit?: number } = {}) {
    this.client = client;
    this.view = new SessionView(userId);
    this.limit = options.limit ?? 100;
  }

  /** Re-pull both folders and the badge. The view's version becomes the lower of the two walks'
   * versions: frames above it overwrite whole rows, so a slightly newer folder converges. */
  async sync(options: CallOptions = {}): Promise<void> {
    const main = await this.client.walk({ folder: "main", limit: this.limit, signal: options.signal });
    const archived = await this.client.walk({ folder: "archived", limit: this.limit, signal: options.signal });
    const badge = await this.client.badge(options);
    this.view.reset([...main.rows, ...archived.rows], Math.min(main.version, archived.version));
    this.view.offerBadge(badge);
    this.syncs += 1;
  }

  /** Apply a frame; on a gap, pull the list again instead of patching. */
  async apply(frame: unknown, options: CallOptions = {}): Promise<ApplyResult> {
    const result = this.view.apply(frame);
    if (result.status === "gap") await this.sync(options);
    return result;
  }
}

/** What LiveStream keeps current: a list it can pull again and patch with frames. */
export interface SyncedList {
  readonly client: SessionsClient;
  readonly view: SessionView;
  /** Pull again (the view restarts from the pull). */
  sync(options?: CallOptions): Promise<void>;
  /** Apply a frame with the rule; a gap pulls again. */
  apply(frame: unknown, options?: CallOptions): Promise<ApplyResult>;
  /** Called with the hello's user before anything else (a list made before the user was known). */
  ensureUser?(userId: UserId): void;
}

export interface PagedListStats {
  pages: number;
  restarts: number;
  repulls: number;
  gaps: number;
  applied: number;
  stale: number;
  malformed: number;
}

/** A folder shown page by page, as a UI with "load more" does (docs/contract.md §5): sync()
 * loads the first page of a new walk, nextPage() the next one of the same snapshot revision; a
 * next page answered with projection_complete = false is the first page of a new revision and
 * the walk restarts from it. Frames patch the view with the client rule; visible() is the folder
 * in list order down to the last row the walk loaded (a row a frame moved up from further down
 * shows at once; one below the walk shows when the walk gets there). Frames applied while a first
 * page was on its way are re-applied over it, so an older snapshot never hides a newer frame. */
export class PagedSessionList implements SyncedList {
  readonly client: SessionsClient;
  readonly folder: Folder;
  readonly limit: number;
  readonly stats: PagedListStats = { pages: 0, restarts: 0, repulls: 0, gaps: 0, applied: 0, stale: 0, malformed: 0 };
  /** The cursor of the next page (null: none, or nothing loaded yet). */
  cursor: string | null = null;
  /** The walk reached the folder's end. */
  done = false;
  /** A first page has been loaded. */
  synced = false;
  private currentView: SessionView;
  private last: SessionRow | null = null;
  private recent: SessionDeltaFrame[] = [];

  /** `userId` null: not known yet (a page holding only a token); the stream's hello sets it. */
  constructor(client: SessionsClient, userId: UserId | null, options: { limit?: number; folder?: Folder } = {}) {
    this.client = client;
    this.currentView = new SessionView(userId ?? "");
    this.limit = options.limit ?? 20;
    this.folder = options.folder ?? "main";
  }

  get view(): SessionView {
    return this.currentView;
  }

  ensureUser(userId: UserId): void {
    if (userId !== this.currentView.userId) {
      this.currentView = new SessionView(userId);
      this.synced = false;
      this.recent = [];
      this.last = null;
    }
  }

  /** The first page of a new walk (at most 3 tries when frames applied meanwhile do not chain
   * from it: a later walk's snapshot is at least as new as every frame received). */
  async sync(options: CallOptions = {}): Promise<void> {
    if (this.synced) this.stats.repulls += 1;
    for (let attempt = 0; attempt < 3; attempt += 1) {
      const page = await this.client.page({ folder: this.folder, limit: this.limit, signal: options.signal });
      this.stats.pages += 1;
      if (this.load(page, true)) return;
    }
  }

  /** The next page of the walk (nothing at the end). */
  async nextPage(options: CallOptions = {}): Promise<void> {
    if (this.done || this.cursor === null) return;
    const page = await this.client.page({ folder: this.folder, limit: this.limit, cursor: this.cursor, signal: options.signal });
    this.stats.pages += 1;
    if (page.projection_complete) {
      this.load(page, false);
      return;
    }
    // The folder's structure changed (pin, archive, leave, delete) or the snapshot expired: this
    // is the first page of a new revision. The walk starts over from it.
    this.stats.restarts += 1;
    if (!this.load(page, true)) await this.sync(options);
  }

  async apply(frame: unknown, options: CallOptions = {}): Promise<ApplyResult> {
    let result: ApplyResult;
    try {
      result = this.currentView.apply(frame);
    } catch (error) {
      if (error instanceof ProtocolError) this.stats.malformed += 1;
      throw error;
    }
    if (result.status === "gap") {
      this.stats.gaps += 1;
      await this.sync(options);
      return result;
    }
    if (result.status === "stale") this.stats.stale += 1;
    else this.stats.applied += 1;
    const f = frame as SessionDeltaFrame;
    if (f.type === "SESSION_DELTA" && f.correction !== true) {
      this.recent.push(f);
      if (this.recent.length > 64) this.recent.shift();
    }
    return result;
  }

  /** The folder's rows to show, in list order. */
  visible(): SessionRow[] {
    const rows = this.folder === "main" ? this.currentView.main() : this.currentView.archived();
    if (this.done) return rows;
    const last = this.last;
    if (last === null) return [];
    return rows.filter((r) => compareRows(r, last) <= 0);
  }

  private load(page: SessionPage, first: boolean): boolean {
    const at = page.projection_mailbox_seq;
    let consistent = true;
    if (first) {
      const before = this.currentView.version;
      this.currentView.reset(page.items, at); // the badge held stays (it has its own version)
      // Frames applied while this page was on its way may be newer than its snapshot.
      if (before > at) consistent = this.replayRecent();
      this.last = page.items[page.items.length - 1] ?? null;
    } else {
      this.currentView.merge(page.items, at);
      const tail = page.items[page.items.length - 1];
      if (tail !== undefined) this.last = tail;
    }
    this.cursor = page.next_cursor;
    this.done = page.next_cursor === null;
    this.synced = true;
    return consistent;
  }

  private replayRecent(): boolean {
    for (const frame of this.recent) {
      if (frame.projection_mailbox_seq <= this.currentView.version) continue;
      if (this.currentView.apply(frame).status === "gap") return false;
    }
    return true;
  }
}
