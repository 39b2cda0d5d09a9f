// The page: sign in with a token, show the main folder page by page kept live from /v1/stream,
// the badge, and a conversation's members. Every client rule comes from the TypeScript SDK's
// browser build (served by the API under /app/sdk/): the session list and its client rule
// (PagedSessionList + LiveStream), the member directory (MembersClient), the one member store
// per account/group (MemberStoreRegistry) with its cache in this browser's storage
// (WebStorageMemberCache), and avatars loaded only for visible rows (AvatarLoader). This file
// only renders what those hold.
import {
  AvatarLoader,
  HttpClient,
  LiveStream,
  MemberAccessDeniedError,
  MemberStoreRegistry,
  MembersClient,
  PagedSessionList,
  SessionsClient,
  WebStorageMemberCache,
  displayCount,
  showsUnread,
} from "./sdk/index.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const limit = Math.min(Math.max(parseInt(params.get("limit") || "20", 10) || 20, 1), 100);
const ENVIRONMENT = `web:${location.origin}`;

const state = {
  http: null,
  list: null,
  stream: null,
  running: null, // the stream's AbortController
  members: null, // MembersClient
  registry: null, // MemberStoreRegistry of the signed-in account
  cache: null, // WebStorageMemberCache
  store: null, // the shown group's MemberStore
  subscription: null,
  avatars: null, // AvatarLoader
  avatarLoads: [], // the avatar URLs the page asked for, in order
  selected: null,
  notices: [],
  timings: null, // the member drawer's milestones (ms since it opened)
};
window.__sp = state; // for debugging (and the browser tests)

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
  if (state.running) state.running.abort();
  if (state.registry) state.registry.close(); // an account switch: the old account's work ends
  state.registry = null;
  state.http = new HttpClient({baseUrl: location.origin, token});
  state.members = new MembersClient(state.http);
  state.list = new PagedSessionList(new SessionsClient(state.http), null, {limit});
  state.stream = new LiveStream(state.list, {
    reconnectMs: 500,
    onChange: render,
    onStatus: (text) => {
      $("status").textContent = text;
    },
    onNotice: notice,
  });
  $("login").hidden = true;
  $("main").hidden = false;
  state.running = new AbortController();
  void state.stream.run({signal: state.running.signal});
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
  if (!list || !list.synced) return;
  const view = list.view;
  $("user").textContent = view.userId; // the u64 as the string it arrived as
  $("version").textContent = String(view.version);
  const badge = view.badge;
  if (badge) {
    $("badge").hidden = false;
    $("badge").textContent = displayCount(badge.total_unread); // 99+ above 99 (seed 000 §3.3)
    $("badge").dataset.version = String(badge.version);
    $("badge").dataset.count = String(badge.total_unread);
    $("badge").title =
      `${badge.total_unread} unread, ${badge.total_mention} mentions (counting ${badge.badge_mode}); ` +
      `archived: ${badge.archived_unread} unread, ${badge.archived_mention} mentions`;
  }
  const items = list.visible().map((row) => {
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
    unread.className = "unread" + (showsUnread(row) ? "" : " zero") + (row.muted ? " muted" : "");
    // A marked row with nothing unread shows a dot; a count above 99 (or inexact) shows 99+.
    unread.textContent = row.unread_count === 0 && marked ? "\u25cf" : displayCount(row.unread_count, row.unread_exact);
    li.append(title, unread, last);
    li.addEventListener("click", () => selectConversation(row.conversation_id));
    return li;
  });
  $("list").replaceChildren(...items);
  $("more").hidden = list.done;
  $("end").hidden = !list.done;
}

// -- members ----------------------------------------------------------------------------------

// The cache port with its load timed (the seed's "cached answer" milestone).
function timedCache(cache) {
  return {
    load: async (key, options) => {
      const started = performance.now();
      const roster = await cache.load(key, options);
      if (state.timings && state.timings.group === key.group && state.timings.cacheAnswer === undefined) {
        state.timings.cacheAnswer = performance.now() - started;
        state.timings.cacheHit = roster !== null;
      }
      return roster;
    },
    store: (key, members, stillCurrent) => cache.store(key, members, stillCurrent),
    delete: (key) => cache.delete(key),
  };
}

function registry() {
  const account = state.list.view.userId;
  if (state.registry && state.registry.account === account) return state.registry;
  if (state.registry) state.registry.close();
  const key = WebStorageMemberCache.pageKey(localStorage);
  state.cache = new WebStorageMemberCache(localStorage, key);
  state.registry = new MemberStoreRegistry(ENVIRONMENT, account, state.members, {
    cache: timedCache(state.cache),
    profiles: state.members, // names and avatars (POST /api/v1/users/profiles)
    onHistoryInvalidated: (store) => {
      if (store.key.group === state.selected) $("history").textContent = "History window: dropped (member left)";
    },
  });
  return state.registry;
}

function selectConversation(conversationId) {
  if (!state.list || !state.list.synced) return;
  if (state.subscription) state.subscription.close(); // the old drawer's work ends (the store stays idle)
  state.selected = conversationId;
  state.timings = {group: conversationId, opened: performance.now()};
  $("members").hidden = false;
  $("members-of").textContent = conversationId;
  $("history").textContent = "History window: loaded";
  $("member-list").replaceChildren();
  rowsByRef.clear();
  if (state.avatars) state.avatars.close();
  state.avatars = new AvatarLoader({
    load: (img, url) => {
      state.avatarLoads.push(url);
      img.src = url;
    },
  });
  render();
  const reg = registry();
  state.store = reg.store(conversationId);
  state.subscription = reg.subscribe(conversationId, renderMembers);
  renderMembers(state.store);
}

const rowsByRef = new Map(); // memberRef -> {member, li}: an unchanged member keeps its row

function memberRow(member) {
  const li = document.createElement("li");
  li.className = "member";
  const img = document.createElement("img");
  img.className = "avatar";
  img.alt = "";
  img.width = 24;
  img.height = 24;
  const name = document.createElement("span");
  name.className = "name";
  const stats = document.createElement("span");
  stats.className = "stats";
  li.append(img, name, stats);
  fillRow(li, member);
  return li;
}

function fillRow(li, member) {
  li.dataset.memberRef = member.memberRef;
  li.dataset.role = member.role;
  const [img, name, stats] = li.children;
  name.textContent = member.remark || member.displayName || member.userId;
  name.title = member.userId;
  // Statistics unknown: an empty cell of the same height, never a fake 0.
  stats.textContent = member.statsKnown ? `${member.recordCount} msgs · ${member.mentionCount} @` : "";
  li.classList.toggle("stats-unknown", !member.statsKnown);
  li.classList.toggle("profile-failed", member.profileFailed);
  if (member.avatarUrl !== (img.dataset.url || null)) {
    img.dataset.url = member.avatarUrl || "";
    img.removeAttribute("src");
    state.avatars.observe(img, member.avatarUrl); // loaded when the row is visible
  }
}

function renderMembers(store) {
  if (store !== state.store) return;
  const members = store.sorted();
  const ul = $("member-list");
  const seen = new Set();
  const ordered = [];
  for (const member of members) {
    seen.add(member.memberRef);
    let held = rowsByRef.get(member.memberRef);
    if (held === undefined) {
      held = {member, li: memberRow(member)};
      rowsByRef.set(member.memberRef, held);
    } else if (held.member !== member) {
      fillRow(held.li, member); // only a changed member object touches its row
      held.member = member;
    }
    ordered.push(held.li);
  }
  for (const [ref, held] of rowsByRef) {
    if (!seen.has(ref)) {
      state.avatars.unobserve(held.li.children[0]);
      held.li.remove();
      rowsByRef.delete(ref);
    }
  }
  // Keep the DOM in roster order with as few moves as possible.
  let cursor = ul.firstChild;
  for (const li of ordered) {
    if (li === cursor) cursor = cursor.nextSibling;
    else ul.insertBefore(li, cursor);
  }
  $("member-count").textContent = String(members.length);
  $("roster-reads").textContent = String(store.counters.traversalsCompleted);
  const aside = $("members");
  aside.dataset.fresh = String(store.fresh);
  aside.dataset.cachedAt = store.cachedAtMillis === null ? "" : String(store.cachedAtMillis);
  aside.dataset.selfRole = store.selfRole || "";
  aside.dataset.canRemove = String(store.adminCapabilities.remove_members === true);
  // Silent refresh: rows already shown get no "updating" line; only an empty drawer and real
  // failures say something.
  let status = "";
  if (store.error instanceof MemberAccessDeniedError) status = `no access (${store.error.code})`;
  else if (store.error) status = members.length ? `not refreshed: ${store.error.message}` : `unavailable: ${store.error.message}`;
  else if (!members.length && !store.fresh) status = "loading…";
  $("member-status").textContent = status;
  milestones(store, members);
}

function milestones(store, members) {
  const t = state.timings;
  if (!t || t.group !== store.key.group) return;
  const now = performance.now() - t.opened;
  if (t.cachedVisible === undefined && store.counters.cacheHits > 0 && store.counters.pages === 0 && members.length) {
    t.cachedVisible = now;
    t.cachedVisibleCount = members.length;
  }
  if (t.first50 === undefined && store.counters.pages > 0 && members.length >= Math.min(50, store.size)) t.first50 = now;
  if (t.fresh === undefined && store.fresh) t.fresh = now;
  if (t.complete === undefined && store.fresh && members.every((m) => m.presented || m.profileFailed)) {
    t.complete = now;
  }
}

// Member notices (seed 004): t=24 re-reads the roster, t=27 also drops the history window; the
// registry hands each to the store of its group (the SDK's rule).
function notice(n) {
  state.notices.push(n);
  $("log-section").hidden = false;
  const li = document.createElement("li");
  li.textContent = `kind ${n.kind} in ${n.conversation_id} at seq ${n.conversation_seq}`;
  $("notices").prepend(li);
  if (state.registry) void state.registry.onNotice(n);
}
