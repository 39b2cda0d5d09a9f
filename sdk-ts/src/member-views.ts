// The two member views besides the drawer (seed 004): the @-candidates of a compose box and a
// message's read-receipt details. Both subscribe to the group's ONE member store through the
// account's registry (the drawer's store: a member it loaded is never requested again for them),
// take every name, remark and avatar from that store, and never create or revive a member: a read
// fact about a member the store does not hold shows as a bare id until the store holds it.
// What a page keeps of them is view state only (the typed prefix, how many rows are shown).

import { RequestError, isAbort } from "./errors.js";
import type { CallOptions } from "./http.js";
import type { MemberRef, UserId } from "./ids.js";
import { READERS_LIMIT_MAX, type ReadReceipts, type ReadReceiptsRequest } from "./members.js";
import type { MemberStore, MemberStoreRegistry, StoreMember, Subscription } from "./store.js";

/** A name as the @-prefix is matched against it: NFKC, lower case. */
export function foldName(text: string): string {
  return text.normalize("NFKC").toLowerCase();
}

/** The names an @-candidate answers to: the viewer's remark (备注) and the public display name;
 * a member with neither yet (not presented) answers to its user id, which is what its row shows. */
export function mentionNames(member: StoreMember): string[] {
  const names = [member.remark, member.displayName].filter((n): n is string => n !== null && n !== "");
  return names.length > 0 ? names : [member.userId];
}

/** Whether `member` is an @-candidate for the typed `prefix` (after the "@"): one of its names
 * starts with it, case folded; the empty prefix matches everyone. */
export function matchesMention(member: StoreMember, prefix: string): boolean {
  const wanted = foldName(prefix.trim());
  return mentionNames(member).some((name) => foldName(name).startsWith(wanted));
}

/** The @-candidates among `members` (roster order kept): active members other than `viewer`
 * whose remark or display name starts with `prefix`. */
export function mentionCandidates(members: readonly StoreMember[], prefix: string, viewer: UserId | null = null): StoreMember[] {
  return members.filter((m) => m.state === "active" && m.userId !== viewer && matchesMention(m, prefix));
}

export const MENTION_ROWS_DEFAULT = 20;

export interface MentionPickerOptions {
  /** The signed-in user: never a candidate of their own message. */
  viewer?: UserId | null;
  /** Candidates shown at first and added by each showMore(). Default 20. */
  rows?: number;
  onChange?: (picker: MentionPicker) => void;
}

/** The @-candidate list of one compose box, over the group's member store. Candidates change as
 * the store does (pages landing, presentation, a confirmed removal, a new remark); the list is
 * filtered, never fetched: the store's traversal is the only server paging there is. */
export class MentionPicker {
  readonly store: MemberStore;
  private readonly subscription: Subscription;
  private readonly viewer: UserId | null;
  private readonly rows: number;
  private readonly onChange: ((picker: MentionPicker) => void) | undefined;
  private prefixText = "";
  private shownCount: number;
  private memo: { sorted: readonly StoreMember[]; prefix: string; matches: StoreMember[] } | null = null;
  private closed = false;

  constructor(registry: MemberStoreRegistry, group: string, options: MentionPickerOptions = {}) {
    this.viewer = options.viewer ?? null;
    this.rows = options.rows ?? MENTION_ROWS_DEFAULT;
    if (!Number.isInteger(this.rows) || this.rows < 1) throw new RangeError("rows must be a positive integer");
    this.shownCount = this.rows;
    this.onChange = options.onChange;
    this.store = registry.store(group);
    // Subscribing starts the store's traversal only when nobody (the drawer) holds it already.
    this.subscription = registry.subscribe(group, () => this.changed());
  }

  get prefix(): string {
    return this.prefixText;
  }

  /** What was typed after the "@"; the shown rows start over. */
  setPrefix(prefix: string): void {
    if (prefix === this.prefixText) return;
    this.prefixText = prefix;
    this.shownCount = this.rows;
    this.changed();
  }

  /** Every candidate the store holds now, in roster order (the same objects as the store's). */
  get matches(): readonly StoreMember[] {
    const sorted = this.store.sorted();
    if (this.memo === null || this.memo.sorted !== sorted || this.memo.prefix !== this.prefixText) {
      this.memo = { sorted, prefix: this.prefixText, matches: mentionCandidates(sorted, this.prefixText, this.viewer) };
    }
    return this.memo.matches;
  }

  /** The candidates to render: the first rows of `matches`. */
  get visible(): readonly StoreMember[] {
    return this.matches.slice(0, this.shownCount);
  }

  /** No candidate is still to come from the server: the store holds a whole traversal. */
  get complete(): boolean {
    return this.store.fresh;
  }

  /** The list scrolled to its end: show more rows. When every match is shown and the roster is
   * not whole (still loading, or its traversal failed), the store is asked to go on reading (a
   * traversal already running is joined, never doubled). Whether anything more may come. */
  showMore(): boolean {
    if (this.matches.length > this.shownCount) {
      this.shownCount += this.rows;
      this.changed();
      return true;
    }
    if (!this.store.fresh && !this.closed) {
      void this.store.refresh();
      return true;
    }
    return false;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.subscription.close();
  }

  private changed(): void {
    if (!this.closed) this.onChange?.(this);
  }
}

/** What the read details need from the server (MembersClient implements it). */
export interface ReadReceiptSource {
  readReceipts(request: ReadReceiptsRequest): Promise<ReadReceipts>;
}

/** One row of the read details: the server's read fact, the store's presentation (undefined
 * while the store does not hold the member: show its id). */
export interface ReadDetailRow {
  readonly memberRef: MemberRef;
  readonly read: boolean;
  readonly member: StoreMember | undefined;
}

export interface ReadReceiptDetailsOptions {
  /** Active members the server examines per page (1..500; the server's default when absent). */
  limit?: number;
  onChange?: (details: ReadReceiptDetails) => void;
}

/** Who has read one message and who has not, a page at a time, through the read-receipt API's
 * light projection (basicOnly: ids and counts). The read facts are the server's and only the
 * server's; names, remarks and avatars come from the group's member store, which this view
 * subscribes to so rows update as presentation lands (seed 004: source.read-receipts.detail +
 * basicOnly first, then the store). A failed page keeps the rows read so far (nextPage retries);
 * an unknown message is the UnknownMessageError the API's 404 becomes. */
export class ReadReceiptDetails {
  readonly group: string;
  readonly conversationSeq: number;
  readonly store: MemberStore;
  /** Pages answered so far. */
  pages = 0;
  /** More members to examine on the server (true until the last page answered). */
  hasMore = true;
  /** The last page's failure (cleared by the next answer); the rows already read stay. */
  error: Error | null = null;
  senderId: UserId | null = null;

  private readonly source: ReadReceiptSource;
  private readonly limit: number | undefined;
  private readonly onChange: ((details: ReadReceiptDetails) => void) | undefined;
  private readonly readRefs: MemberRef[] = [];
  private readonly unreadRefs: MemberRef[] = [];
  private readonly seen = new Set<MemberRef>();
  private next: string | null = null;
  private inFlight: Promise<void> | null = null;
  private readonly controller = new AbortController();
  private readonly subscription: Subscription;
  private closed = false;

  constructor(source: ReadReceiptSource, registry: MemberStoreRegistry, group: string, conversationSeq: number, options: ReadReceiptDetailsOptions = {}) {
    if (!Number.isSafeInteger(conversationSeq) || conversationSeq < 1) {
      throw new RangeError("conversationSeq must be a positive safe integer");
    }
    if (options.limit !== undefined && (!Number.isInteger(options.limit) || options.limit < 1 || options.limit > READERS_LIMIT_MAX)) {
      throw new RangeError(`limit must be an integer from 1 to ${READERS_LIMIT_MAX}`);
    }
    this.source = source;
    this.group = group;
    this.conversationSeq = conversationSeq;
    this.limit = options.limit;
    this.onChange = options.onChange;
    this.store = registry.store(group);
    this.subscription = registry.subscribe(group, () => this.changed());
  }

  /** The read members so far, in the server's order (ascending user id). */
  get read(): readonly ReadDetailRow[] {
    return this.readRefs.map((ref) => this.row(ref, true));
  }

  get unread(): readonly ReadDetailRow[] {
    return this.unreadRefs.map((ref) => this.row(ref, false));
  }

  get readCount(): number {
    return this.readRefs.length;
  }

  get unreadCount(): number {
    return this.unreadRefs.length;
  }

  get loading(): boolean {
    return this.inFlight !== null;
  }

  /** Read the next page (the first one when none was read). A page already in flight is joined;
   * past the last page nothing is asked. Failures land in `error`; an abort by close() is quiet. */
  nextPage(options: CallOptions = {}): Promise<void> {
    if (this.closed || !this.hasMore) return Promise.resolve();
    if (this.inFlight !== null) return this.inFlight;
    const run = this.fetchPage(options).finally(() => {
      this.inFlight = null;
      this.changed();
    });
    this.inFlight = run;
    this.changed();
    return run;
  }

  /** The view is gone: its request is aborted and its store subscription ends. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.controller.abort();
    this.subscription.close();
  }

  private async fetchPage(options: CallOptions): Promise<void> {
    const signal = eitherSignal(this.controller.signal, options.signal);
    let answer: ReadReceipts;
    try {
      answer = await this.source.readReceipts({
        group: this.group,
        conversationSeq: this.conversationSeq,
        basicOnly: true,
        pageRef: this.next,
        signal,
        ...(this.limit !== undefined ? { limit: this.limit } : {}),
      });
    } catch (error) {
      if (!isAbort(error, signal)) this.error = error instanceof Error ? error : new Error(String(error));
      return;
    }
    if (this.closed) return;
    this.error = null;
    this.pages += 1;
    this.senderId = answer.senderId;
    // Pages do not overlap (a user id keyset); a repeated ref would be a server bug: kept once.
    this.append(this.readRefs, answer.readRefs);
    this.append(this.unreadRefs, answer.unreadRefs);
    this.hasMore = answer.hasMore === true && typeof answer.next === "string";
    this.next = this.hasMore ? (answer.next ?? null) : null;
  }

  private append(into: MemberRef[], refs: readonly MemberRef[]): void {
    for (const ref of refs) {
      if (this.seen.has(ref)) continue;
      this.seen.add(ref);
      into.push(ref);
    }
  }

  private row(memberRef: MemberRef, read: boolean): ReadDetailRow {
    return { memberRef, read, member: this.store.member(memberRef) };
  }

  private changed(): void {
    if (!this.closed) this.onChange?.(this);
  }
}

/** The API's 404 for a message the group does not have (code "unknown_message"). */
export function isUnknownMessage(error: unknown): error is RequestError {
  return error instanceof RequestError && error.status === 404 && error.code === "unknown_message";
}

/** A signal aborted when `own` or `caller` is (AbortSignal.any is not in every runtime the SDK
 * supports). */
function eitherSignal(own: AbortSignal, caller: AbortSignal | undefined): AbortSignal {
  if (caller === undefined) return own;
  const both = new AbortController();
  for (const signal of [own, caller]) {
    if (signal.aborted) both.abort(signal.reason);
    else signal.addEventListener("abort", () => both.abort(signal.reason), { once: true });
  }
  return both.signal;
}
