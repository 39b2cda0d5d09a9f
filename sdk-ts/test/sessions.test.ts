import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import ts from "typescript";

import {
  PagedSessionList,
  ProtocolError,
  SessionView,
  SessionsClient,
  TraversalLimitError,
  compareRows,
  displayCount,
  mergeDeltas,
  parseRow,
  showsUnread,
  type SessionDeltaFrame,
  type SessionRow,
} from "../src/index.js";
import { fakeFetch } from "./fakes.js";

const ME = "11982011376358104761"; // a JavaScript number would read 11982011376358105000

function row(n: number, fields: Partial<Record<keyof SessionRow, unknown>> = {}): SessionRow {
  return {
    user_id: ME,
    conversation_id: `00000000-0000-0000-0000-${String(n).padStart(12, "0")}`,
    listed: true,
    membership: "active",
    pinned: false,
    pin_rank: null,
    archived: false,
    muted: false,
    last_activity_id: n.toString(16).padStart(32, "0"),
    latest_conversation_seq: 10,
    last_message_id: `m${n}`,
    unread_count: 0,
    unread_exact: true,
    mention_count: 0,
    mention_first_conversation_seq: null,
    read_conversation_seq: 0,
    hidden_before_conversation_seq: 0,
    deleted_before_conversation_seq: 0,
    joined_at_conversation_seq: 0,
    left_at_conversation_seq: null,
    projection_mailbox_seq: 1,
    ...fields,
  } as SessionRow;
}

function delta(v: number, prev: number, rows: SessionRow[], extra: Record<string, unknown> = {}): SessionDeltaFrame {
  return { type: "SESSION_DELTA", user_id: ME, projection_mailbox_seq: v, prev_projection_mailbox_seq: prev, conversations: rows, ...extra } as SessionDeltaFrame;
}

test("a SESSION_DELTA overwrites rows with its absolute values, never adds", () => {
  const view = new SessionView(ME);
  view.reset([row(1, { unread_count: 5 })], 10);
  const result = view.apply(delta(11, 10, [row(1, { unread_count: 2 })]));
  assert.equal(result.status, "applied");
  assert.equal(view.row(row(1).conversation_id)?.unread_count, 2); // 2, not 7
  assert.equal(view.version, 11);
  // The same frame again (at least once delivery): stale, nothing moves.
  assert.equal(view.apply(delta(11, 10, [row(1, { unread_count: 2 })])).status, "stale");
  assert.equal(view.row(row(1).conversation_id)?.unread_count, 2);
});

test("a frame not newer than the row's version is dropped; a broken chain is a gap (re-pull)", () => {
  const view = new SessionView(ME);
  view.reset([row(1, { unread_count: 1 })], 10);
  assert.equal(view.apply(delta(9, 8, [row(1, { unread_count: 9 })])).status, "stale");
  assert.equal(view.row(row(1).conversation_id)?.unread_count, 1);
  const gap = view.apply(delta(14, 12, [row(1, { unread_count: 4 })]));
  assert.equal(gap.status, "gap");
  assert.equal(view.row(row(1).conversation_id)?.unread_count, 1, "a gap patches nothing");
  assert.equal(view.version, 10);
});

test("a later page of the same walk never overwrites a row a newer frame brought", () => {
  const view = new SessionView(ME);
  view.reset([], 10);
  view.apply(delta(12, 10, [row(2, { unread_count: 3 })]));
  view.merge([row(2, { unread_count: 0 }), row(3)], 10);
  assert.equal(view.row(row(2).conversation_id)?.unread_count, 3);
  assert.ok(view.row(row(3).conversation_id));
});

test("a correction restates its version: overwrites rows held at or below it, keeps newer ones", () => {
  const view = new SessionView(ME);
  view.reset([row(1, { unread_count: 7 }), row(2, { unread_count: 1 })], 10);
  view.apply(delta(11, 10, [row(2, { unread_count: 5 })]));
  const r = view.apply(delta(10, 10, [row(1, { unread_count: 0 }), row(2, { unread_count: 0 })], { correction: true }));
  assert.equal(r.status, "corrected");
  assert.deepEqual(r.conversations, [row(1).conversation_id]);
  assert.equal(view.row(row(1).conversation_id)?.unread_count, 0);
  assert.equal(view.row(row(2).conversation_id)?.unread_count, 5);
  assert.equal(view.version, 11, "a correction does not move the chain");
});

test("BADGE_UPDATE: newest wins by version alone, no gap check", () => {
  const view = new SessionView(ME);
  const badge = (v: number, unread: number) => ({ type: "BADGE_UPDATE", user_id: ME, total_unread: unread, total_mention: 0, muted_unread: 0, projection_mailbox_seq: v, prev_projection_mailbox_seq: v - 1 });
  assert.equal(view.apply(badge(20, 4)).status, "applied");
  assert.equal(view.apply(badge(18, 9)).status, "stale");
  assert.equal(view.apply(badge(25, 1)).status, "applied"); // prev 24 was never seen: still applied
  assert.deepEqual(view.badge, {
    total_unread: 1,
    total_mention: 0,
    muted_unread: 0,
    archived_unread: 0,
    archived_mention: 0,
    badge_mode: "messages",
    include_muted: false,
    version: 25,
  });
});

test("BADGE_UPDATE carries the folder totals and the badge preferences (§10); bad ones are refused", () => {
  const view = new SessionView(ME);
  const frame = {
    type: "BADGE_UPDATE",
    user_id: ME,
    total_unread: 2,
    total_mention: 1,
    muted_unread: 0,
    archived_unread: 3,
    archived_mention: 1,
    badge_mode: "conversations",
    include_muted: true,
    projection_mailbox_seq: 7,
    prev_projection_mailbox_seq: 6,
  };
  assert.equal(view.apply(frame).status, "applied");
  assert.equal(view.badge?.archived_unread, 3);
  assert.equal(view.badge?.badge_mode, "conversations");
  assert.equal(view.badge?.include_muted, true);
  assert.throws(() => view.apply({ ...frame, projection_mailbox_seq: 8, badge_mode: "threads" }), ProtocolError);
  assert.throws(() => view.apply({ ...frame, projection_mailbox_seq: 8, include_muted: 1 }), ProtocolError);
  assert.throws(() => view.apply({ ...frame, projection_mailbox_seq: 8, archived_unread: -1 }), ProtocolError);
});

test("counts above 99 show as 99+, marked rows show as unread (§10, seed 000 §3.3)", () => {
  assert.equal(displayCount(0), "0");
  assert.equal(displayCount(99), "99");
  assert.equal(displayCount(100), "99+");
  assert.equal(displayCount(150), "99+");
  assert.equal(displayCount(7, false), "99+");
  assert.equal(showsUnread(row(1)), false);
  assert.equal(showsUnread(row(1, { marked_unread: true })), true);
  assert.equal(showsUnread(row(1, { unread_count: 2 })), true);
  assert.throws(() => parseRow(row(1, { marked_unread: "yes" })), ProtocolError);
  assert.equal(parseRow(row(1, { marked_unread: true })).marked_unread, true);
});

test("ids must be decimal strings and versions safe integers; another user's frame is foreign", () => {
  const view = new SessionView(ME);
  view.reset([], 1);
  assert.throws(() => view.apply({ ...delta(2, 1, []), user_id: 11982011376358104761 }), ProtocolError);
  assert.throws(() => view.apply(delta(2 ** 53, 1, [])), ProtocolError);
  assert.throws(() => view.apply(delta(2, 1, [row(1, { user_id: 5 })])), ProtocolError);
  assert.equal(view.apply({ ...delta(2, 1, []), user_id: "5" }).status, "foreign");
  assert.equal(view.version, 1);
});

test("list order: pinned by rank, then newest activity, null activity last, then conversation id", () => {
  const rows = [row(1), row(2, { pin_rank: 5 }), row(3, { pin_rank: 0 }), row(4, { last_activity_id: null }), row(5)];
  assert.deepEqual(rows.sort(compareRows).map((r) => r.last_message_id), ["m3", "m2", "m5", "m1", "m4"]);
});

test("merging within the window only drops a conversation's older row, and only along the chain", () => {
  const merged = mergeDeltas([
    delta(11, 10, [row(1, { unread_count: 1 }), row(2)]),
    delta(12, 11, [row(1, { unread_count: 2 })]),
    delta(15, 13, [row(3)]), // not contiguous: kept apart, so the gap stays visible
  ]);
  assert.equal(merged.length, 2);
  assert.equal(merged[0]?.prev_projection_mailbox_seq, 10);
  assert.equal(merged[0]?.projection_mailbox_seq, 12);
  assert.deepEqual(merged[0]?.conversations.map((r) => r.unread_count), [2, 0]);
  const view = new SessionView(ME);
  view.reset([], 10);
  assert.equal(view.apply(merged[0]).status, "applied");
  assert.equal(view.apply(merged[1]).status, "gap");
});

test("no count is ever incremented on the frame path (no +=, -=, ++ or -- in SessionView or mergeDeltas)", () => {
  const path = new URL("../../src/sessions.ts", import.meta.url);
  const source = ts.createSourceFile("sessions.ts", readFileSync(path, "utf8"), ts.ScriptTarget.ES2022, true);
  const found: string[] = [];
  const banned = new Set([ts.SyntaxKind.PlusEqualsToken, ts.SyntaxKind.MinusEqualsToken]);
  const visit = (node: ts.Node): void => {
    if (ts.isBinaryExpression(node) && banned.has(node.operatorToken.kind)) found.push(node.getText());
    if ((ts.isPrefixUnaryExpression(node) || ts.isPostfixUnaryExpression(node)) && (node.operator === ts.SyntaxKind.PlusPlusToken || node.operator === ts.SyntaxKind.MinusMinusToken)) found.push(node.getText());
    ts.forEachChild(node, visit);
  };
  let checked = 0;
  source.forEachChild((node) => {
    if ((ts.isClassDeclaration(node) && node.name?.text === "SessionView") || (ts.isFunctionDeclaration(node) && node.name?.text === "mergeDeltas")) {
      checked += 1;
      visit(node);
    }
  });
  assert.equal(checked, 2);
  assert.deepEqual(found, []);
});

test("a walk follows the cursors and starts over when the server says the revision changed", async () => {
  let restarted = false;
  const fetch = fakeFetch((call) => {
    const url = new URL(call.url);
    assert.equal(call.headers["Authorization"], "Bearer tok");
    const cursor = url.searchParams.get("cursor");
    const page = (items: SessionRow[], next: string | null, complete: boolean, rev: number) => ({
      status: 200,
      json: { items, next_cursor: next, snapshot_revision: rev, projection_complete: complete, projection_mailbox_seq: 40 + rev, folder: "main", filled_from_state: false, truncated: false },
    });
    if (cursor === null) return page([row(1), row(2)], "c1", true, 1);
    if (cursor === "c1" && !restarted) {
      restarted = true;
      return page([row(1), row(3)], "c2", false, 2); // a new revision's first page
    }
    return page([row(4)], null, true, 2);
  });
  const client = new SessionsClient({ baseUrl: "http://api/", token: "tok", fetch });
  const walk = await client.walk({ limit: 2 });
  assert.deepEqual(walk.rows.map((r) => r.last_message_id), ["m1", "m3", "m4"]);
  assert.equal(walk.restarts, 1);
  assert.equal(walk.version, 42);
  assert.equal(walk.rows[0]?.user_id, ME);
});

test("a walk restarted more often than allowed fails instead of looping", async () => {
  let n = 0;
  const fetch = fakeFetch(() => ({
    status: 200,
    json: { items: [row(1)], next_cursor: `c${++n}`, snapshot_revision: n, projection_complete: n === 1, projection_mailbox_seq: 1, folder: "main", filled_from_state: false, truncated: false },
  }));
  const client = new SessionsClient({ baseUrl: "http://api", token: "t", fetch });
  await assert.rejects(client.walk({ maxRestarts: 2 }), TraversalLimitError);
});

test("reconcile: accepted, then told when to ask again; another refusal is an ApiError", async () => {
  let asked = 0;
  const fetch = fakeFetch((call) => {
    assert.equal(call.method, "POST");
    assert.equal(call.path, "/v1/reconcile");
    assert.equal(call.headers["Authorization"], "Bearer tok");
    asked += 1;
    if (asked === 1) return { status: 202, json: { accepted: true, user_id: "7", min_interval_s: 300 } };
    if (asked === 2) {
      return {
        status: 429,
        json: { error: { status: 429, code: "reconcile_too_soon", message: "soon" } },
        headers: { "Retry-After": "299" },
      };
    }
    return { status: 400, json: { error: { status: 400, code: "bad_request", message: "no" } } };
  });
  const client = new SessionsClient({ baseUrl: "http://api/", token: "tok", fetch });
  assert.deepEqual(await client.reconcile(), { accepted: true, retryAfterS: null, minIntervalS: 300 });
  assert.deepEqual(await client.reconcile(), { accepted: false, retryAfterS: 299, minIntervalS: null });
  await assert.rejects(client.reconcile(), (error: unknown) => (error as { status?: number }).status === 400);
});

test("a paged list shows what its walk loaded, a frame moves a row up, a restart starts over", async () => {
  // rows 1..6, newest first: row(6) has the highest activity.
  const all = [6, 5, 4, 3, 2, 1].map((n) => row(n, { projection_mailbox_seq: 10 }));
  let revision = 1;
  const fetch = fakeFetch((call) => {
    const cursor = new URL(call.url).searchParams.get("cursor");
    const page = (items: SessionRow[], next: string | null, complete: boolean) => ({
      status: 200,
      json: { items, next_cursor: next, snapshot_revision: revision, projection_complete: complete, projection_mailbox_seq: 10, folder: "main", filled_from_state: false, truncated: false },
    });
    if (cursor === null) return page(all.slice(0, 2), "c2", true);
    if (cursor === "c2" && revision === 1) return page(all.slice(2, 4), "c4", true);
    if (cursor === "c4" && revision === 2) return page(all.slice(0, 2), "c2", false); // the structure changed
    return page(all.slice(4), null, true);
  });
  const list = new PagedSessionList(new SessionsClient({ baseUrl: "http://api", token: "t", fetch }), null, { limit: 2 });
  list.ensureUser(ME);
  await list.sync();
  assert.deepEqual(list.visible().map((r) => r.last_message_id), ["m6", "m5"]);
  // A frame moves row 1 (not loaded yet) to the top: shown at once; row 3 (below the walk) not.
  const moved = row(1, { last_activity_id: "f".repeat(32), unread_count: 1 });
  assert.equal((await list.apply(delta(11, 10, [moved]))).status, "applied");
  assert.deepEqual(list.visible().map((r) => r.last_message_id), ["m1", "m6", "m5"]);
  await list.nextPage();
  assert.deepEqual(list.visible().map((r) => r.last_message_id), ["m1", "m6", "m5", "m4", "m3"]);
  // The next page answers projection_complete = false: the walk restarts from it, and the frame
  // newer than its snapshot is applied over it again (never hidden by an older page).
  revision = 2;
  await list.nextPage();
  assert.equal(list.stats.restarts, 1);
  assert.deepEqual(list.visible().map((r) => r.last_message_id), ["m1", "m6", "m5"]);
  assert.equal(list.view.row(moved.conversation_id)?.unread_count, 1);
  assert.equal(list.view.version, 11);
  // A gap pulls the first page again instead of patching.
  const before = list.stats.pages;
  assert.equal((await list.apply(delta(20, 15, [row(2)]))).status, "gap");
  assert.equal(list.stats.gaps, 1);
  assert.equal(list.stats.pages, before + 1);
});
