// The live stream: GET /v1/stream (Server-Sent Events) read over fetch, so the bearer token and
// Last-Event-ID go in headers (EventSource can send neither). Events: hello (first: badge, the
// store's version, status fresh | resumed | repull), SESSION_DELTA, BADGE_UPDATE, MEMBER_NOTICE,
// heartbeat, repull. A reconnect sends Last-Event-ID = the version the view holds: the server
// replays what was missed when it still has every frame after it, otherwise says repull.

import { ProtocolError } from "./errors.js";
import { isObject, readJson, apiError, type ByteStreamLike, type CallOptions } from "./http.js";
import { isSafeCount, isUserId, type UserId } from "./ids.js";
import { badgeOf, type Badge, type SyncedList } from "./sessions.js";

/** One Server-Sent Event. */
export interface SseEvent {
  readonly event: string;
  readonly data: string;
  readonly id: string | null;
}

/** Parses an SSE byte stream (the WHATWG rules: `event`, `data`, `id`, comments, CR/LF/CRLF). */
export class SseParser {
  private buffer = "";
  private event = "";
  private data: string[] = [];
  private id: string | null = null;
  private readonly decoder = new TextDecoder();

  /** Feed bytes (or text); returns the events completed by them. */
  push(chunk: Uint8Array | string): SseEvent[] {
    this.buffer += typeof chunk === "string" ? chunk : this.decoder.decode(chunk, { stream: true });
    const out: SseEvent[] = [];
    for (;;) {
      const match = /\r\n|\r|\n/.exec(this.buffer);
      if (match === null) break;
      // A lone CR at the very end may be the first half of a CRLF: wait for the next chunk.
      if (match[0] === "\r" && match.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, match.index);
      this.buffer = this.buffer.slice(match.index + match[0].length);
      const event = this.line(line);
      if (event !== null) out.push(event);
    }
    return out;
  }

  private line(line: string): SseEvent | null {
    if (line === "") {
      if (this.data.length === 0) {
        this.event = "";
        return null;
      }
      const event = { event: this.event || "message", data: this.data.join("\n"), id: this.id };
      this.event = "";
      this.data = [];
      return event;
    }
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.event = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id" && !value.includes("\0")) this.id = value;
    return null;
  }
}

/** A MEMBER_NOTICE: "re-read the roster of this group" (kind 24), and also "drop the history
 * window" (kind 27). It carries no member fact to apply. */
export interface MemberNotice {
  readonly user_id: UserId;
  readonly conversation_id: string;
  readonly kind: number;
  readonly conversation_seq: number;
}

export interface Hello {
  readonly user_id: UserId;
  readonly status: "fresh" | "resumed" | "repull";
  readonly reason: string | null;
  readonly projection_mailbox_seq: number;
  readonly badge: Badge;
  readonly heartbeat_ms: number;
}

export interface LiveStreamOptions {
  onNotice?: (notice: MemberNotice) => void;
  /** After every event handled (the list or badge may have changed). */
  onChange?: () => void;
  onStatus?: (status: string) => void;
  /** First reconnect delay (doubles up to 8 s). Default 500 ms. */
  reconnectMs?: number;
  /** A connection silent for this many heartbeats is dropped and reconnected. Default 3. */
  missedHeartbeats?: number;
}

export interface StreamStats {
  connects: number;
  hellos: Record<string, number>;
  applied: number;
  stale: number;
  gaps: number;
  repulls: number;
  notices: number;
  malformed: number;
  errors: number;
}

/** Keeps a list (LiveSessionList, PagedSessionList) current from /v1/stream; reconnects with
 * Last-Event-ID. */
export class LiveStream {
  readonly list: SyncedList;
  readonly stats: StreamStats = { connects: 0, hellos: {}, applied: 0, stale: 0, gaps: 0, repulls: 0, notices: 0, malformed: 0, errors: 0 };
  lastHello: Hello | null = null;
  /** Whether the list has been pulled on this stream (then a reconnect resumes from its version). */
  synced = false;
  private readonly options: LiveStreamOptions;
  private readonly noticesSeen = new Set<string>();
  private connection: AbortController | null = null;
  private waiters: Array<() => void> = [];

  constructor(list: SyncedList, options: LiveStreamOptions = {}) {
    this.list = list;
    this.options = options;
  }

  /** Run until `signal` aborts: connect, handle events in order, reconnect after a failure. */
  async run(options: CallOptions = {}): Promise<void> {
    const signal = options.signal;
    let backoff = this.options.reconnectMs ?? 500;
    while (!signal?.aborted) {
      try {
        await this.connectOnce(signal);
        backoff = this.options.reconnectMs ?? 500;
      } catch (error) {
        if (signal?.aborted) break;
        this.stats.errors += 1;
        this.status(`reconnecting (${(error as Error)?.message ?? String(error)})`);
      }
      if (signal?.aborted) break;
      await sleep(backoff, signal);
      backoff = Math.min(backoff * 2, 8000);
    }
  }

  /** End the current connection (the run loop reconnects with Last-Event-ID). */
  drop(): void {
    this.connection?.abort();
  }

  /** Resolves at the next handled event (tests and UIs waiting for a condition). */
  changed(): Promise<void> {
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /** Wait until `predicate()` holds, checked after every handled event. */
  async until(predicate: () => boolean, options: CallOptions & { timeoutMs?: number } = {}): Promise<void> {
    const deadline = Date.now() + (options.timeoutMs ?? 30_000);
    while (!predicate()) {
      options.signal?.throwIfAborted();
      const left = deadline - Date.now();
      if (left <= 0) throw new Error("LiveStream.until: timed out");
      await Promise.race([this.changed(), sleep(Math.min(left, 250), options.signal)]);
    }
  }

  /** One connection, to its end. */
  async connectOnce(outer?: AbortSignal): Promise<void> {
    const connection = new AbortController();
    this.connection = connection;
    const abortInner = (): void => connection.abort(outer?.reason);
    outer?.addEventListener("abort", abortInner, { once: true });
    const heartbeats = this.options.missedHeartbeats ?? 3;
    let watchdog: ReturnType<typeof setTimeout> | undefined;
    const arm = (ms: number): void => {
      if (watchdog !== undefined) clearTimeout(watchdog);
      watchdog = setTimeout(() => connection.abort(new Error("heartbeats missed")), ms);
    };
    try {
      const headers: Record<string, string> = { Accept: "text/event-stream" };
      if (this.synced) headers["Last-Event-ID"] = String(this.list.view.version);
      this.status("connecting");
      const http = this.list.client.http;
      const response = await http.send("GET", "/v1/stream", { signal: connection.signal, headers });
      if (response.status !== 200) throw apiError(response, await readJson(response, connection.signal));
      if (response.body === null) throw new ProtocolError("the stream has no body");
      this.stats.connects += 1;
      arm(15_000 * heartbeats);
      await this.consume(response.body, connection.signal, (ms) => arm(ms * heartbeats));
    } catch (error) {
      if (connection.signal.aborted && !outer?.aborted) return; // dropped: the loop reconnects
      throw error;
    } finally {
      if (watchdog !== undefined) clearTimeout(watchdog);
      outer?.removeEventListener("abort", abortInner);
      if (this.connection === connection) this.connection = null;
    }
  }

  private async consume(body: ByteStreamLike, signal: AbortSignal, beat: (ms: number) => void): Promise<void> {
    const reader = body.getReader();
    const parser = new SseParser();
    const cancel = (): void => void reader.cancel(signal.reason).catch(() => undefined);
    signal.addEventListener("abort", cancel, { once: true });
    let heartbeatMs = 15_000;
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done || signal.aborted) return;
        if (value === undefined) continue;
        beat(heartbeatMs);
        for (const event of parser.push(value)) {
          const ms = await this.handle(event, signal);
          if (ms !== null) heartbeatMs = ms;
          if (event.event === "repull") return; // the server ends this stream: reconnect
        }
      }
    } finally {
      signal.removeEventListener("abort", cancel);
      try {
        reader.releaseLock();
      } catch {
        /* a pending read still holds it: the cancel ends it */
      }
    }
  }

  /** Handle one event; returns the heartbeat interval a hello announces. */
  private async handle(event: SseEvent, signal: AbortSignal): Promise<number | null> {
    let result: number | null = null;
    try {
      if (event.event === "heartbeat") return null;
      let data: unknown;
      try {
        data = JSON.parse(event.data);
      } catch {
        this.stats.malformed += 1;
        return null;
      }
      if (!isObject(data)) {
        this.stats.malformed += 1;
        return null;
      }
      switch (event.event) {
        case "hello":
          result = await this.hello(parseHello(data), signal);
          break;
        case "SESSION_DELTA":
        case "BADGE_UPDATE":
          if (!this.synced) break;
          await this.frame(data, signal);
          break;
        case "MEMBER_NOTICE":
          this.notice(data);
          break;
        case "repull":
          this.stats.repulls += 1;
          this.synced = false;
          break;
        default:
          break;
      }
    } finally {
      this.options.onChange?.();
      const waiters = this.waiters;
      this.waiters = [];
      for (const wake of waiters) wake();
    }
    return result;
  }

  private async hello(hello: Hello, signal: AbortSignal): Promise<number> {
    this.lastHello = hello;
    this.stats.hellos[hello.status] = (this.stats.hellos[hello.status] ?? 0) + 1;
    this.list.ensureUser?.(hello.user_id);
    if (hello.user_id !== this.list.view.userId) throw new ProtocolError("the stream is another user's");
    if (hello.status !== "resumed" || !this.synced) {
      // Registered before this hello: every frame newer than the pull follows it.
      this.status(hello.status === "repull" ? "re-pulling" : "loading");
      if (hello.status === "repull") this.stats.repulls += 1;
      await this.list.sync({ signal });
      this.synced = true;
    }
    this.list.view.offerBadge(hello.badge);
    this.status(`live (${hello.status})`);
    return hello.heartbeat_ms;
  }

  private async frame(data: Record<string, unknown>, signal: AbortSignal): Promise<void> {
    try {
      const result = await this.list.apply(data, { signal });
      if (result.status === "gap") this.stats.gaps += 1;
      else if (result.status === "stale") this.stats.stale += 1;
      else this.stats.applied += 1;
    } catch (error) {
      if (error instanceof ProtocolError) {
        this.stats.malformed += 1;
        return;
      }
      throw error;
    }
  }

  private notice(data: Record<string, unknown>): void {
    const kind = data["kind"];
    const seq = data["conversation_seq"];
    if (typeof data["conversation_id"] !== "string" || !isSafeCount(kind) || !isSafeCount(seq) || !isUserId(data["user_id"])) {
      this.stats.malformed += 1;
      return;
    }
    this.stats.notices += 1;
    // At least once (a resume may replay one): (conversation, kind, seq) names a notice.
    const key = `${data["conversation_id"]}/${kind}/${seq}`;
    if (this.noticesSeen.has(key)) return;
    this.noticesSeen.add(key);
    if (this.noticesSeen.size > 1000) {
      const oldest = this.noticesSeen.values().next().value;
      if (oldest !== undefined) this.noticesSeen.delete(oldest);
    }
    this.options.onNotice?.({ user_id: data["user_id"], conversation_id: data["conversation_id"], kind, conversation_seq: seq });
  }

  private status(text: string): void {
    this.options.onStatus?.(text);
  }
}

function parseHello(data: Record<string, unknown>): Hello {
  const status = data["status"];
  if (status !== "fresh" && status !== "resumed" && status !== "repull") throw new ProtocolError(`hello status ${String(status)}`);
  if (!isUserId(data["user_id"])) throw new ProtocolError("hello without user_id");
  const badge = data["badge"];
  if (!isObject(badge)) throw new ProtocolError("hello without badge");
  const n = (obj: Record<string, unknown>, key: string): number => {
    const v = obj[key];
    if (!isSafeCount(v)) throw new ProtocolError(`hello: ${key} must be a safe integer`);
    return v;
  };
  return {
    user_id: data["user_id"],
    status,
    reason: typeof data["reason"] === "string" ? data["reason"] : null,
    projection_mailbox_seq: n(data, "projection_mailbox_seq"),
    badge: badgeOf(badge),
    heartbeat_ms: isSafeCount(data["heartbeat_ms"]) && data["heartbeat_ms"] > 0 ? data["heartbeat_ms"] : 15_000,
  };
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
