// Session projector browser client library (no DOM, no build step, no dependencies).
//
//   const api = new ApiClient(location.origin, token);
//   const list = new LiveList(api, {limit: 20});
//   const stream = new LiveStream(api, list, {onNotice, onChange});
//   stream.start();                      // hello -> first page -> frames, reconnects by itself
//   list.visible(); list.view.badge;     // what to show; list.nextPage() walks on
//
// The client rule (docs/contract.md §4; the Python twin is app/domain/client.py): frames carry ABSOLUTE
// rows; a row is applied only when its frame's projection_mailbox_seq is above the version held
// for that conversation, by overwriting it (never `+=` on a count); a SESSION_DELTA whose
// prev_projection_mailbox_seq is not the version this client holds means frames were lost:
// re-pull the list instead of patching. u64 ids (user_id) are decimal strings end to end: a
// JavaScript number cannot hold them (11982011376358104761 would read 11982011376358105000).
// Versions and counts are numbers; every version compared is checked to be a safe integer.

export class FrameError extends Error {}

// A badge from a BADGE_UPDATE frame, a hello's badge or /v1/badge (docs/contract.md §3.8, §10):
// the folder totals and the preferences default when an older server leaves them out.
export function badgeOf(obj) {
  const optional = (key) => (obj[key] === undefined ? 0 : version(obj, key));
  const mode = obj.badge_mode ?? "messages";
  if (mode !== "messages" && mode !== "conversations") throw new FrameError(`badge_mode ${JSON.stringify(mode)}`);
  const includeMuted = obj.include_muted ?? false;
  if (typeof includeMuted !== "boolean") throw new FrameError("include_muted must be a boolean");
  return {
    total_unread: version(obj, "total_unread"),
    total_mention: version(obj, "total_mention"),
    muted_unread: version(obj, "muted_unread"),
    archived_unread: optional("archived_unread"),
    archived_mention: optional("archived_mention"),
    badge_mode: mode,
    include_muted: includeMuted,
    version: version(obj, "projection_mailbox_seq"),
  };
}

// How a count is shown (seed 000 §3.3): above 99, or inexact, "99+".
export function displayCount(count, exact = true) {
  return !exact || count > 99 ? "99+" : String(count);
}

function version(obj, key) {
  const v = obj[key];
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
    throw new FrameError(`${key} must be a non-negative safe integer, got ${JSON.stringify(v)}`);
  }
  return v;
}

function idString(obj, key) {
  const v = obj[key];
  if (typeof v !== "string" || !/^(0|[1-9][0-9]{0,19})$/.test(v)) {
    throw new FrameError(`${key} must be a u64 as a decimal string, got ${JSON.stringify(v)}`);
  }
  return v;
}

// List order (docs/contract.md §5): pinned zone by pin_rank ASC, then last_activity_id DESC (null last),
// then conversation_id ASC; the normal zone the same without pin_rank.
export function compareRows(a, b) {
  const za = a.pin_rank === null || a.pin_rank === undefined ? 1 : 0;
  const zb = b.pin_rank === null || b.pin_rank === undefined ? 1 : 0;
  if (za !== zb) return za - zb;
  if (za === 0 && a.pin_rank !== b.pin_rank) return a.pin_rank - b.pin_rank;
  const aa = a.last_activity_id, ab = b.last_activity_id;
  if (aa !== ab) {
    if (aa === null || aa === undefined) return 1;
    if (ab === null || ab === undefined) return -1;
    return aa < ab ? 1 : -1; // 32 lowercase hex chars: string order is time order
  }
  return a.conversation_id < b.conversation_id ? -1 : a.conversation_id > b.conversation_id ? 1 : 0;
}

export class SessionView {
  constructor(userId) {
    this.userId = userId; // a string
    this.version = 0; // the chain position: the next delta must name it as prev
    this.rows = new Map(); // conversation_id -> row
    this.rowVersions = new Map();
    this.badge = null; // {total_unread, total_mention, muted_unread, version}
  }

  reset(rows, at) {
    version({v: at}, "v");
    this.rows = new Map();
    this.rowVersions = new Map();
    for (const row of rows) {
      this.rows.set(row.conversation_id, row);
      this.rowVersions.set(row.conversation_id, at);
    }
    this.version = at;
  }

  // Rows of a later page of the same walk (a snapshot at `at`): never over a newer row.
  merge(rows, at) {
    for (const row of rows) {
      const held = this.rowVersions.get(row.conversation_id);
      if (held !== undefined && held > at) continue;
      this.rows.set(row.conversation_id, row);
      this.rowVersions.set(row.conversation_id, at);
    }
  }

  offerBadge(badge) {
    if (this.badge !== null && badge.version <= this.badge.version) return false;
    this.badge = badge;
    return true;
  }

  apply(frame) {
    if (frame.type === "SESSION_DELTA") return this.applyDelta(frame);
    if (frame.type === "BADGE_UPDATE") return this.applyBadge(frame);
    throw new FrameError(`not a client frame: ${frame.type}`);
  }

  applyDelta(frame) {
    const v = version(frame, "projection_mailbox_seq");
    const prev = version(frame, "prev_projection_mailbox_seq");
    const correction = frame.correction === true;
    if (!Array.isArray(frame.conversations)) throw new FrameError("conversations must be a list");
    for (const row of frame.conversations) {
      if (typeof row.conversation_id !== "string") throw new FrameError("row without conversation_id");
    }
    if (idString(frame, "user_id") !== this.userId) return {status: "foreign", version: v};
    if (correction) {
      // An audit correction restates version v: it overwrites rows held at or below v only.
      if (prev !== v) throw new FrameError("a correction restates its version");
      const changed = [];
      for (const row of frame.conversations) {
        const held = this.rowVersions.get(row.conversation_id);
        if (held !== undefined && held > v) continue;
        this.rows.set(row.conversation_id, row);
        this.rowVersions.set(row.conversation_id, v);
        changed.push(row.conversation_id);
      }
      return {status: changed.length ? "corrected" : "stale", version: v, conversations: changed};
    }
    if (prev >= v) throw new FrameError("prev_projection_mailbox_seq must be below projection_mailbox_seq");
    if (v <= this.version) return {status: "stale", version: v};
    if (prev !== this.version) return {status: "gap", version: v};
    const changed = [];
    for (const row of frame.conversations) {
      const held = this.rowVersions.get(row.conversation_id);
      if (held !== undefined && v <= held) continue;
      this.rows.set(row.conversation_id, row); // overwrite, never add
      this.rowVersions.set(row.conversation_id, v);
      changed.push(row.conversation_id);
    }
    this.version = v;
    return {status: "applied", version: v, conversations: changed};
  }

  applyBadge(frame) {
    const v = version(frame, "projection_mailbox_seq");
    const badge = badgeOf(frame);
    if (idString(frame, "user_id") !== this.userId) return {status: "foreign", version: v};
    const held = this.badge;
    const correction = frame.correction === true;
    if (held !== null && (v < held.version || (v === held.version && !correction))) {
      return {status: "stale", version: v};
    }
    this.badge = badge; // absolute totals: the newest is complete, no gap check
    return {status: correction ? "corrected" : "applied", version: v};
  }

  listed() {
    return [...this.rows.values()].filter((r) => r.listed !== false).sort(compareRows);
  }
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

export class ApiClient {
  constructor(baseUrl, token) {
    this.baseUrl = baseUrl.replace(/\/$/, "");
    this.token = token;
  }

  async request(method, path, body) {
    const init = {method, headers: {Authorization: `Bearer ${this.token}`}, cache: "no-store"};
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(this.baseUrl + path, init);
    let payload = null;
    try {
      payload = await response.json();
    } catch (_) {
      throw new ApiError(response.status, "invalid_response", "not JSON");
    }
    if (!response.ok) {
      const e = (payload && payload.error) || {};
      throw new ApiError(response.status, e.code || "?", e.message || "");
    }
    return payload;
  }

  page({folder = "main", limit = 20, cursor = null} = {}) {
    const q = new URLSearchParams({folder, limit: String(limit)});
    if (cursor) q.set("cursor", cursor);
    return this.request("GET", `/v1/sessions?${q}`);
  }

  badge() {
    return this.request("GET", "/v1/badge");
  }

  ticket() {
    return this.request("POST", "/v1/stream/ticket");
  }

  members(conversationId, limit = 50) {
    return this.request("POST", "/api/v1/chats/members/page", {
      chat_session_uid: conversationId,
      limit,
      active_only: true,
    });
  }
}

// The main folder, walked page by page with the cursor, kept live by frames.
export class LiveList {
  constructor(api, {limit = 20} = {}) {
    this.api = api;
    this.limit = limit;
    this.view = null; // created on the first page (the user id comes from the stream's hello)
    this.userId = null;
    this.cursor = null;
    this.done = false;
    this.last = null; // the last row the walk has loaded (what is below it is not shown yet)
    this.synced = false;
    this.recent = []; // the last deltas applied: re-applied over a reset to an older snapshot
    this.stats = {pages: 0, restarts: 0, repulls: 0, gaps: 0, applied: 0, stale: 0, malformed: 0};
  }

  ensureView(userId) {
    if (this.view === null || this.userId !== userId) {
      this.userId = userId;
      this.view = new SessionView(userId);
    }
  }

  // Load the first page of a (new) walk: the list restarts from it.
  async reload() {
    for (let attempt = 0; attempt < 3; attempt += 1) {
      const page = await this.api.page({limit: this.limit});
      this.stats.pages += 1;
      if (this.load(page, true)) return;
    }
  }

  async nextPage() {
    if (this.done || this.cursor === null) return;
    const page = await this.api.page({limit: this.limit, cursor: this.cursor});
    this.stats.pages += 1;
    if (page.projection_complete) {
      this.load(page, false);
      return;
    }
    // The list's structure changed (pin, archive, leave, delete) or the snapshot expired: this
    // is the first page of a new revision. Start the walk over from it.
    this.stats.restarts += 1;
    if (!this.load(page, true)) await this.reload();
  }

  // False when a first page is older than frames already applied and those do not chain from
  // it (then pull again: a new walk's snapshot is at least as new as every frame received).
  load(page, first) {
    const at = version(page, "projection_mailbox_seq");
    const items = page.items;
    let consistent = true;
    if (first) {
      const before = this.view.version;
      this.view.reset(items, at);
      // Frames applied while this page was on its way may be newer than its snapshot: apply
      // them again over it (the rule drops what the page already has).
      if (before > at) consistent = this.replayRecent();
      this.last = items.length ? items[items.length - 1] : null;
    } else {
      this.view.merge(items, at);
      if (items.length) this.last = items[items.length - 1];
    }
    this.cursor = page.next_cursor;
    this.done = page.next_cursor === null;
    this.synced = true;
    return consistent;
  }

  replayRecent() {
    for (const frame of this.recent) {
      if (frame.projection_mailbox_seq <= this.view.version) continue;
      if (this.view.apply(frame).status === "gap") return false;
    }
    return true;
  }

  // Returns true when the frame says to re-pull (a gap).
  apply(frame) {
    let result;
    try {
      result = this.view.apply(frame);
    } catch (e) {
      if (e instanceof FrameError) {
        this.stats.malformed += 1;
        return false;
      }
      throw e;
    }
    if (result.status === "gap") {
      this.stats.gaps += 1;
      return true;
    }
    if (result.status === "stale") this.stats.stale += 1;
    else this.stats.applied += 1;
    if (frame.type === "SESSION_DELTA" && frame.correction !== true) {
      this.recent.push(frame);
      if (this.recent.length > 64) this.recent.shift();
    }
    return false;
  }

  // The rows to show: the main folder in list order, down to the last row the walk loaded (a
  // row a frame brought from further down shows once the walk gets there, or when it moves up).
  visible() {
    if (this.view === null) return [];
    const rows = this.view.listed().filter((r) => r.archived !== true);
    if (this.done) return rows;
    if (this.last === null) return [];
    return rows.filter((r) => compareRows(r, this.last) <= 0);
  }
}

// The live stream: /v1/stream over EventSource with a ticket, hello -> pull, frames in order,
// reconnects (new ticket, last_event_id = the version the view holds), a heartbeat watchdog.
export class LiveStream {
  constructor(api, list, {onNotice = () => {}, onChange = () => {}, onStatus = () => {}} = {}) {
    this.api = api;
    this.list = list;
    this.onNotice = onNotice;
    this.onChange = onChange;
    this.onStatus = onStatus;
    this.es = null;
    this.queue = Promise.resolve(); // events are handled one at a time, in order
    this.heartbeatMs = 15000;
    this.lastEventAt = 0;
    this.backoffMs = 500;
    this.stopped = false;
    this.timer = null;
    this.watchdog = null;
    this.stats = {connects: 0, hellos: {}, notices: 0, repullEvents: 0, heartbeats: 0, errors: 0};
    this.lastHello = null;
    this.noticesSeen = new Set();
  }

  start() {
    this.stopped = false;
    this.connect();
    this.watchdog = setInterval(() => this.checkAlive(), 1000);
  }

  stop() {
    this.stopped = true;
    clearInterval(this.watchdog);
    clearTimeout(this.timer);
    if (this.es) this.es.close();
  }

  // Drop the connection and reconnect (what a flaky network does; tests use it too).
  drop() {
    if (this.es) this.es.close();
    this.es = null;
    this.scheduleReconnect(0);
  }

  async connect() {
    if (this.stopped) return;
    this.onStatus("connecting");
    let ticket;
    try {
      ticket = (await this.api.ticket()).ticket;
    } catch (e) {
      this.stats.errors += 1;
      this.onStatus(`offline (${e.message})`);
      this.scheduleReconnect();
      return;
    }
    const q = new URLSearchParams({access_token: ticket});
    if (this.list.synced) q.set("last_event_id", String(this.list.view.version));
    const es = new EventSource(`${this.api.baseUrl}/v1/stream?${q}`);
    this.es = es;
    this.stats.connects += 1;
    this.lastEventAt = Date.now();
    const on = (name, handler) =>
      es.addEventListener(name, (event) => {
        if (this.es !== es) return; // an old connection's late event
        this.lastEventAt = Date.now();
        let data;
        try {
          data = JSON.parse(event.data);
        } catch (_) {
          this.list.stats.malformed += 1;
          return;
        }
        this.enqueue(() => handler(data));
      });
    on("hello", (hello) => this.hello(hello));
    on("SESSION_DELTA", (frame) => this.frame(frame));
    on("BADGE_UPDATE", (frame) => this.frame(frame));
    on("MEMBER_NOTICE", (notice) => {
      // At least once (a resume may replay one): (conversation, kind, seq) names a notice.
      this.stats.notices += 1;
      const key = `${notice.conversation_id}/${notice.kind}/${notice.conversation_seq}`;
      if (this.noticesSeen.has(key)) return;
      this.noticesSeen.add(key);
      if (this.noticesSeen.size > 1000) this.noticesSeen.delete(this.noticesSeen.values().next().value);
      this.onNotice(notice);
    });
    on("repull", async () => {
      this.stats.repullEvents += 1;
      await this.repull();
    });
    on("heartbeat", () => {
      this.stats.heartbeats += 1;
    });
    es.onerror = () => {
      if (this.es !== es) return;
      // Reconnect ourselves: a fresh ticket, and last_event_id = what the view holds.
      es.close();
      this.es = null;
      this.stats.errors += 1;
      this.onStatus("reconnecting");
      this.scheduleReconnect();
    };
  }

  scheduleReconnect(delay) {
    clearTimeout(this.timer);
    const wait = delay === undefined ? this.backoffMs : delay;
    this.backoffMs = Math.min(this.backoffMs * 2, 8000);
    this.timer = setTimeout(() => this.connect(), wait);
  }

  checkAlive() {
    if (this.es && Date.now() - this.lastEventAt > 3 * this.heartbeatMs) {
      this.drop(); // three heartbeats missed: the connection is dead even if the socket is not
    }
  }

  enqueue(step) {
    this.queue = this.queue
      .then(step)
      .catch((e) => {
        this.stats.errors += 1;
        this.onStatus(`error: ${e.message}`);
      })
      .then(() => this.onChange());
  }

  async hello(hello) {
    this.lastHello = hello;
    this.stats.hellos[hello.status] = (this.stats.hellos[hello.status] || 0) + 1;
    this.heartbeatMs = hello.heartbeat_ms || this.heartbeatMs;
    this.backoffMs = 500;
    this.list.ensureView(idString(hello, "user_id"));
    if (hello.status !== "resumed" || !this.list.synced) {
      // Registered before this hello: every frame newer than the pull follows it.
      this.onStatus(hello.status === "repull" ? "re-pulling" : "loading");
      if (hello.status === "repull") this.list.stats.repulls += 1;
      await this.list.reload();
    }
    this.list.view.offerBadge(badgeOf(hello.badge));
    this.onStatus(`live (${hello.status})`);
  }

  async frame(frame) {
    if (!this.list.synced) return;
    if (this.list.apply(frame)) await this.repull();
  }

  async repull() {
    this.list.stats.repulls += 1;
    this.onStatus("re-pulling");
    await this.list.reload();
    this.onStatus("live");
  }
}
