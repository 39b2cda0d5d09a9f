// The page: sign in with a token, walk the main folder page by page, keep it live from
// /v1/stream (sp-client.js holds the client rule), show the badge, react to member notices.
import {ApiClient, LiveList, LiveStream, displayCount} from "./sp-client.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const limit = Math.min(Math.max(parseInt(params.get("limit") || "20", 10) || 20, 1), 100);

const state = {api: null, list: null, stream: null, selected: null, rosterReads: 0, notices: []};
window.__sp = state; // for debugging (and the browser test)

$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!token) return;
  sessionStorage.setItem("sp-token", token); // this tab only; never in the URL
  start(token);
});

const saved = sessionStorage.getItem("sp-token");
if (saved) {
  $("token").value = saved;
}

function start(token) {
  if (state.stream) state.stream.stop();
  state.api = new ApiClient(location.origin, token);
  state.list = new LiveList(state.api, {limit});
  state.stream = new LiveStream(state.api, state.list, {
    onChange: render,
    onStatus: (text) => {
      $("status").textContent = text;
    },
    onNotice: notice,
  });
  $("login").hidden = true;
  $("main").hidden = false;
  state.stream.start();
}

$("more").addEventListener("click", async () => {
  $("more").disabled = true;
  try {
    await state.list.nextPage();
  } catch (e) {
    $("status").textContent = `error: ${e.message}`;
  } finally {
    $("more").disabled = false;
    render();
  }
});

function render() {
  const list = state.list;
  if (!list || !list.view) return;
  $("user").textContent = list.userId; // the u64 as the string it arrived as
  $("version").textContent = String(list.view.version);
  const badge = list.view.badge;
  if (badge) {
    $("badge").hidden = false;
    $("badge").textContent = displayCount(badge.total_unread); // 99+ above 99 (seed 000 §3.3)
    $("badge").dataset.version = String(badge.version);
    $("badge").dataset.count = String(badge.total_unread);
    $("badge").title =
      `${badge.total_unread} unread, ${badge.total_mention} mentions (counting ${badge.badge_mode}); ` +
      `archived: ${badge.archived_unread} unread, ${badge.archived_mention} mentions`;
  }
  const rows = list.visible();
  const ul = $("list");
  const items = rows.map((row) => {
    const li = document.createElement("li");
    const marked = row.marked_unread === true; // docs/contract.md §10: shown as unread
    li.className =
      "row" +
      (row.pin_rank !== null ? " pinned" : "") +
      (marked ? " marked" : "") +
      (row.conversation_id === state.selected ? " selected" : "");
    li.dataset.conversationId = row.conversation_id;
    const title = document.createElement("span");
    title.className = "title";
    title.textContent = row.conversation_id;
    const last = document.createElement("span");
    last.className = "last";
    last.textContent = row.last_message_id === null ? "(no messages)" : `last: ${row.last_message_id}`;
    const unread = document.createElement("span");
    const shown = row.unread_count > 0 || marked;
    unread.className = "unread" + (shown ? "" : " zero") + (row.muted ? " muted" : "");
    // A marked row with nothing unread shows a dot; a count above 99 (or inexact) shows 99+.
    unread.textContent = row.unread_count === 0 && marked ? "\u25cf" : displayCount(row.unread_count, row.unread_exact);
    li.append(title, unread, last);
    li.addEventListener("click", () => selectConversation(row.conversation_id));
    return li;
  });
  ul.replaceChildren(...items);
  $("more").hidden = list.done;
  $("end").hidden = !list.done;
}

async function selectConversation(conversationId) {
  state.selected = conversationId;
  state.rosterReads = 0;
  $("members").hidden = false;
  $("members-of").textContent = conversationId;
  $("history").textContent = "History window: loaded";
  render();
  await readRoster();
}

async function readRoster() {
  const conversationId = state.selected;
  if (!conversationId) return;
  try {
    const ids = [];
    let after = null;
    for (let pages = 0; pages < 200; pages += 1) {
      const body = {chat_session_uid: conversationId, limit: 100, active_only: true};
      if (after !== null) body.page_ref = after; // opaque: handed back as it came
      const page = await state.api.request("POST", "/api/v1/chats/members/page", body);
      ids.push(...page.items.map((m) => m.user_id));
      if (!page.has_more) break;
      after = page.next_page_ref;
    }
    if (conversationId !== state.selected) return;
    state.rosterReads += 1;
    $("member-count").textContent = String(ids.length);
    $("roster-reads").textContent = String(state.rosterReads);
    $("member-list").replaceChildren(
      ...ids.slice(0, 60).map((id) => Object.assign(document.createElement("li"), {textContent: id})),
    );
  } catch (e) {
    $("member-count").textContent = `unavailable (${e.message})`;
  }
}

// Member notices (seed 004): t=24 a member joined -> re-read the roster; t=27 a member left
// with history -> also drop the history window. Only the shown conversation has a roster here.
function notice(n) {
  state.notices.push(n);
  $("log-section").hidden = false;
  const li = document.createElement("li");
  li.textContent = `kind ${n.kind} in ${n.conversation_id} at seq ${n.conversation_seq}`;
  $("notices").prepend(li);
  if (n.conversation_id !== state.selected) return;
  if (n.kind === 27) $("history").textContent = "History window: dropped (member left)";
  if (n.kind === 24 || n.kind === 27) readRoster();
}
