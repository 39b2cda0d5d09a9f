// The page: sign in with a token, show the main folder page by page kept live from /v1/stream,
// the badge, and a conversation's members. Every client rule comes from the TypeScript SDK's
// browser build (served by the API under /app/sdk/): the session list and its client rule
// (PagedSessionList + LiveStream), the member directory (MembersClient), the one member store
// per account/group (MemberStoreRegistry) with its cache in this browser's storage
// (WebStorageMemberCache), avatars loaded only for visible rows (AvatarLoader), and the two
// views besides the drawer over that same store: the @-candidates of the compose box
// (MentionPicker) and a message's read-receipt details (ReadReceiptDetails). This file only
// renders what those hold and keeps view state (the typed prefix, the selected candidate).
import {
  AvatarLoader,
  HttpClient,
  LiveStream,
  MemberAccessDeniedError,
  MemberStoreRegistry,
  MembersClient,
  MentionPicker,
  PagedSessionList,
  ReadReceiptDetails,
  RequestError,
  SessionsClient,
  WebStorageMemberCache,
  displayCount,
  isUnknownMessage,
  showsUnread,
} from "./sdk/index.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const limit = Math.min(Math.max(parseInt(params.get("limit") || "20", 10) || 20, 1), 100);
// Members the server examines per read-receipt page (absent: the server's default).
const readLimit = params.has("readLimit") ? Math.min(Math.max(parseInt(params.get("readLimit"), 10) || 100, 1), 500) : undefined;
const MENTION_ROWS = 10; // candidates rendered at first and per scroll to the end
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
  avatars: null, // the drawer's AvatarLoader
  avatarLoads: [], // the avatar URLs the page asked for, in order
  viewAvatarLoads: {drawer: [], mentions: [], reads: []}, // the same, by the view that asked
  picker: null, // the compose box's MentionPicker (while an "@" is being typed)
  pickerAvatars: null,
  activeCandidate: 0, // index of the highlighted candidate
  mentioned: new Map(), // memberRef -> the name inserted for it
  details: null, // the shown ReadReceiptDetails
  readAvatars: null,
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

$("member-refresh").addEventListener("click", () => {
  if (state.store) void state.store.refresh(); // a retry after a failure, or a re-read
});

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
  state.avatars = avatarLoader("drawer");
  closePicker();
  state.mentioned.clear();
  $("compose-text").value = "";
  $("mentioned").textContent = "";
  delete $("mentioned").dataset.refs;
  closeReads();
  const latest = latestSeq(conversationId);
  $("read-seq").value = latest === null ? "" : String(latest);
  render();
  const reg = registry();
  state.store = reg.store(conversationId);
  state.subscription = reg.subscribe(conversationId, renderMembers);
  renderMembers(state.store);
}

const rowsByRef = new Map(); // memberRef -> {member, li}: an unchanged member keeps its row

// One loader per view: each view's rows get their avatar once visible (seed 004).
function avatarLoader(view) {
  return new AvatarLoader({
    load: (img, url) => {
      state.avatarLoads.push(url);
      state.viewAvatarLoads[view].push(url);
      img.src = url;
    },
  });
}

// What a row calls a member: the viewer's remark, else the public name, else the id.
function memberLabel(member, memberRef) {
  if (member === undefined) return memberRef;
  return member.remark || member.displayName || member.userId;
}

function showAvatar(loader, img, url) {
  if (url === (img.dataset.url || null)) return;
  img.dataset.url = url || "";
  img.removeAttribute("src");
  loader.observe(img, url); // loaded when the row is visible
}

function latestSeq(conversationId) {
  const row = state.list.visible().find((r) => r.conversation_id === conversationId);
  return row && row.latest_conversation_seq !== null ? row.latest_conversation_seq : null;
}

// One list row of a member: its avatar (loaded only while visible), its name, and the extra
// spans a view adds (stats in the drawer, what else matched in the @-picker).
function personRow(className, ...extraClasses) {
  const li = document.createElement("li");
  li.className = className;
  const img = document.createElement("img");
  img.className = "avatar";
  img.alt = "";
  img.width = 24;
  img.height = 24;
  const name = document.createElement("span");
  name.className = "name";
  const extras = extraClasses.map((extra) => {
    const span = document.createElement("span");
    span.className = extra;
    return span;
  });
  li.append(img, name, ...extras);
  return li;
}

function memberRow(member) {
  const li = personRow("member", "stats");
  fillRow(li, member);
  return li;
}

function fillRow(li, member) {
  li.dataset.memberRef = member.memberRef;
  li.dataset.role = member.role;
  const [img, name, stats] = li.children;
  name.textContent = memberLabel(member);
  name.title = member.userId;
  // Statistics unknown: an empty cell of the same height, never a fake 0.
  stats.textContent = member.statsKnown ? `${member.recordCount} msgs · ${member.mentionCount} @` : "";
  li.classList.toggle("stats-unknown", !member.statsKnown);
  li.classList.toggle("profile-failed", member.profileFailed);
  showAvatar(state.avatars, img, member.avatarUrl);
}

// `ul` holds exactly `lis`, in that order, with as few moves as possible (a scrolled list keeps
// its scroll position; an unchanged row is never re-created).
function placeRows(ul, lis) {
  let cursor = ul.firstChild;
  for (const li of lis) {
    if (li === cursor) cursor = cursor.nextSibling;
    else ul.insertBefore(li, cursor);
  }
  while (cursor) {
    const next = cursor.nextSibling;
    cursor.remove();
    cursor = next;
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
  placeRows(ul, ordered);
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

// -- @-candidates ------------------------------------------------------------------------------
// Typing "@" in the compose box opens the picker over the selected group's member store (the
// drawer's: seed 004's one store per account/group); what follows the "@" up to the caret is the
// prefix, matched by the SDK (MentionPicker) against the remark and the display name. Choosing
// a candidate puts "@name " in the text. Sending is not part of this page.

const MENTION_AT = /(?:^|\s)@([^\s@]*)$/;
const candidateRows = new Map(); // memberRef -> li

function typedMention() {
  const input = $("compose-text");
  const caret = input.selectionStart === null ? input.value.length : input.selectionStart;
  const before = input.value.slice(0, caret);
  const found = MENTION_AT.exec(before);
  return found ? {prefix: found[1], start: caret - found[1].length - 1, end: caret} : null;
}

function updateMentions() {
  const typed = typedMention();
  if (typed === null || !state.selected || !state.list || !state.list.synced) {
    closePicker();
    return;
  }
  if (state.picker === null) {
    state.pickerAvatars = avatarLoader("mentions");
    state.picker = new MentionPicker(registry(), state.selected, {
      viewer: state.list.view.userId,
      rows: MENTION_ROWS,
      onChange: renderCandidates,
    });
  }
  if (typed.prefix !== state.picker.prefix) state.activeCandidate = 0;
  state.picker.setPrefix(typed.prefix);
  renderCandidates(state.picker);
}

function closePicker() {
  if (state.picker) state.picker.close();
  if (state.pickerAvatars) state.pickerAvatars.close();
  state.picker = null;
  state.pickerAvatars = null;
  state.activeCandidate = 0;
  candidateRows.clear();
  $("mention-list").replaceChildren();
  delete $("mention-list").dataset.prefix;
  $("mention-list").hidden = true;
  $("mention-status").hidden = true;
}

function candidateRow() {
  const li = personRow("candidate", "also");
  li.setAttribute("role", "option");
  // mousedown, not click: the input keeps its focus and caret.
  li.addEventListener("mousedown", (event) => {
    event.preventDefault();
    choose(li.dataset.memberRef);
  });
  return li;
}

function renderCandidates(picker) {
  if (picker !== state.picker) return;
  const shown = picker.visible;
  if (state.activeCandidate >= shown.length) state.activeCandidate = Math.max(shown.length - 1, 0);
  const keep = new Set();
  const lis = shown.map((member, i) => {
    keep.add(member.memberRef);
    let li = candidateRows.get(member.memberRef);
    if (li === undefined) {
      li = candidateRow();
      candidateRows.set(member.memberRef, li);
    }
    const [img, name, also] = li.children;
    li.dataset.memberRef = member.memberRef;
    name.textContent = memberLabel(member);
    name.title = member.userId;
    // With a remark shown, the public name too (the prefix may have matched either).
    also.textContent = member.remark && member.displayName ? member.displayName : "";
    showAvatar(state.pickerAvatars, img, member.avatarUrl);
    li.classList.toggle("active", i === state.activeCandidate);
    li.setAttribute("aria-selected", String(i === state.activeCandidate));
    return li;
  });
  for (const [ref, li] of candidateRows) {
    if (!keep.has(ref)) {
      state.pickerAvatars.unobserve(li.children[0]);
      candidateRows.delete(ref);
    }
  }
  const ul = $("mention-list");
  const wasHidden = ul.hidden;
  placeRows(ul, lis);
  // A new prefix is a new list: from its top (a list left scrolled to its end would show more).
  if (ul.dataset.prefix !== picker.prefix) ul.scrollTop = 0;
  ul.dataset.prefix = picker.prefix;
  ul.hidden = lis.length === 0;
  ul.dataset.matches = String(picker.matches.length);
  ul.dataset.complete = String(picker.complete);
  if (wasHidden && !ul.hidden) ul.scrollIntoView({block: "nearest"});
  // Silent refresh: candidates shown get no "updating" line; only an empty list says why.
  let status = "";
  if (!lis.length) {
    if (picker.store.error) status = `members unavailable: ${picker.store.error.message}`;
    else if (picker.complete) status = `no member matches "@${picker.prefix}"`;
    else status = "loading members…";
  }
  $("mention-status").textContent = status;
  $("mention-status").hidden = status === "";
}

function choose(memberRef) {
  const typed = typedMention();
  const member = state.picker && state.picker.store.member(memberRef);
  if (!typed || !member) return;
  const label = memberLabel(member);
  const input = $("compose-text");
  input.value = input.value.slice(0, typed.start) + "@" + label + " " + input.value.slice(typed.end);
  const caret = typed.start + label.length + 2;
  input.setSelectionRange(caret, caret);
  state.mentioned.set(memberRef, label);
  $("mentioned").textContent = [...state.mentioned.values()].join(", ");
  $("mentioned").dataset.refs = [...state.mentioned.keys()].join(",");
  closePicker();
}

$("compose").addEventListener("submit", (event) => event.preventDefault());
$("compose-text").addEventListener("input", updateMentions);
$("compose-text").addEventListener("click", updateMentions); // the caret moved
$("compose-text").addEventListener("blur", () => closePicker());
$("compose-text").addEventListener("keydown", (event) => {
  const picker = state.picker;
  if (!picker || !picker.visible.length) return;
  const count = picker.visible.length;
  if (event.key === "ArrowDown" || event.key === "ArrowUp") {
    event.preventDefault();
    state.activeCandidate = (state.activeCandidate + (event.key === "ArrowDown" ? 1 : count - 1)) % count;
    if (event.key === "ArrowDown" && state.activeCandidate === count - 1) picker.showMore();
    renderCandidates(picker);
    const active = $("mention-list").children[state.activeCandidate];
    if (active) active.scrollIntoView({block: "nearest"});
  } else if (event.key === "Enter" || event.key === "Tab") {
    event.preventDefault();
    choose(picker.visible[state.activeCandidate].memberRef);
  } else if (event.key === "Escape") {
    closePicker();
  }
});
$("mention-list").addEventListener("mousedown", (event) => event.preventDefault()); // keep the caret
$("mention-list").addEventListener("scroll", () => {
  const ul = $("mention-list");
  if (state.picker && ul.scrollTop + ul.clientHeight >= ul.scrollHeight - 32) state.picker.showMore();
});

// -- read receipts ---------------------------------------------------------------------------
// Who has read a message: the server's facts a page at a time (ReadReceiptDetails, basicOnly),
// names and avatars from the group's member store as they land. An unknown message (404) or a
// number the server refuses (400) is said plainly; a failed page keeps the rows and can retry.

const readRowsByRef = {read: new Map(), unread: new Map()};

$("reads-form").addEventListener("submit", (event) => {
  event.preventDefault();
  openReads($("read-seq").value);
});
$("read-more").addEventListener("click", () => {
  if (state.details) void state.details.nextPage();
});

function openReads(text) {
  closeReads();
  if (!state.selected || !state.list || !state.list.synced) return;
  $("reads").hidden = false;
  $("reads").dataset.seq = text.trim();
  const seq = Number(text);
  if (!/^[0-9]+$/.test(text.trim()) || !Number.isSafeInteger(seq) || seq < 1) {
    showReadError(`"${text.trim()}" is not a message number: message numbers are whole numbers from 1.`);
    return;
  }
  state.readAvatars = avatarLoader("reads");
  state.details = new ReadReceiptDetails(state.members, registry(), state.selected, seq, {
    limit: readLimit,
    onChange: renderReads,
  });
  void state.details.nextPage();
}

function closeReads() {
  if (state.details) state.details.close();
  if (state.readAvatars) state.readAvatars.close();
  state.details = null;
  state.readAvatars = null;
  readRowsByRef.read.clear();
  readRowsByRef.unread.clear();
  $("read-list").replaceChildren();
  $("unread-list").replaceChildren();
  $("read-count").textContent = "0";
  $("unread-count").textContent = "0";
  $("read-more").hidden = true;
  showReadError("");
  $("reads").hidden = true;
}

function showReadError(text) {
  $("read-error").textContent = text;
  $("read-error").hidden = text === "";
}

function readErrorText(details) {
  const error = details.error;
  const seq = details.conversationSeq;
  if (isUnknownMessage(error)) return `No message #${seq} in this conversation.`;
  if (error instanceof MemberAccessDeniedError) return `No access to this conversation's members (${error.code}).`;
  if (error instanceof RequestError && error.status === 400) return `Message #${seq} was refused: ${error.message}`;
  return `Read receipts not loaded: ${error.message}`;
}

function readRow() {
  return personRow("reader");
}

function fillReadRows(ul, rows, held) {
  const lis = rows.map((row) => {
    let li = held.get(row.memberRef);
    if (li === undefined) {
      li = readRow();
      held.set(row.memberRef, li);
    }
    const [img, name] = li.children;
    li.dataset.memberRef = row.memberRef;
    li.dataset.read = String(row.read);
    // A member the store does not hold (yet) is its bare id: a read fact never makes one up.
    name.textContent = memberLabel(row.member, row.memberRef);
    name.title = row.memberRef;
    showAvatar(state.readAvatars, img, row.member === undefined ? null : row.member.avatarUrl);
    return li;
  });
  placeRows(ul, lis);
}

function renderReads(details) {
  if (details !== state.details) return;
  fillReadRows($("read-list"), details.read, readRowsByRef.read);
  fillReadRows($("unread-list"), details.unread, readRowsByRef.unread);
  $("read-count").textContent = String(details.readCount);
  $("unread-count").textContent = String(details.unreadCount);
  const section = $("reads");
  section.dataset.pages = String(details.pages);
  section.dataset.hasMore = String(details.hasMore);
  section.dataset.loading = String(details.loading);
  // Silent refresh: rows shown get no "updating" line; the first load and failures say so.
  if (details.error) showReadError(readErrorText(details));
  else showReadError(details.pages === 0 && details.loading ? "loading…" : "");
  $("read-error").classList.toggle("error", details.error !== null);
  const final = details.error !== null && (isUnknownMessage(details.error) || details.error instanceof RequestError);
  const more = $("read-more");
  more.hidden = !details.hasMore || final || (details.pages === 0 && !details.error);
  more.textContent = details.error ? "Retry" : "More";
  more.disabled = details.loading;
}
