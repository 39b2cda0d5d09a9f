// The operator console's page (issue 17). Plain browser JavaScript, no build step.
// Every value from the server is rendered with textContent (a dead letter's raw record, a
// frame, a message id are data, never markup). Actions are POSTs carrying the CSRF token
// (the ops_csrf cookie, echoed in X-CSRF-Token: the signed double-submit of app/api/ops/auth.py).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v;
      else if (k.startsWith("data-")) node.setAttribute(k, v);
      else node[k] = v;
    }
    for (const child of children) {
      node.append(child instanceof Node ? child : document.createTextNode(show(child)));
    }
    return node;
  }

  function show(v) {
    if (v === null || v === undefined) return "—";
    if (typeof v === "object") return JSON.stringify(v);
    return String(v);
  }

  function cookie(name) {
    for (const part of document.cookie.split(";")) {
      const [k, ...rest] = part.trim().split("=");
      if (k === name) return decodeURIComponent(rest.join("="));
    }
    return "";
  }

  async function api(path, options) {
    const opts = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
    if (opts.method === "POST") opts.headers["X-CSRF-Token"] = cookie("ops_csrf");
    const resp = await fetch(path, opts);
    let body = null;
    try {
      body = await resp.json();
    } catch (e) {
      body = null;
    }
    if (resp.status === 401) {
      window.location.reload(); // the page answers with the sign-in form
    }
    if (!resp.ok) {
      const msg = body && body.error ? body.error.message : "HTTP " + resp.status;
      const err = new Error(msg);
      err.status = resp.status;
      throw err;
    }
    return body;
  }

  function fmtTime(seconds) {
    if (!seconds) return "never";
    const ago = Math.max(0, Date.now() / 1000 - seconds);
    return new Date(seconds * 1000).toLocaleTimeString() + " (" + ago.toFixed(0) + " s ago)";
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  // -- tabs ------------------------------------------------------------------------------------

  const tabs = ["user", "conversation", "fleet", "dead-letters"];
  let fleetTimer = null;

  function route() {
    const hash = window.location.hash.replace(/^#/, "");
    const [tab, arg] = hash.split("=");
    const current = tabs.includes(tab) ? tab : "user";
    for (const name of tabs) $("tab-" + name).hidden = name !== current;
    for (const a of document.querySelectorAll("nav a")) {
      a.classList.toggle("active", a.dataset.tab === current);
    }
    if (fleetTimer) {
      clearInterval(fleetTimer);
      fleetTimer = null;
    }
    if (current === "fleet") {
      loadFleet();
      fleetTimer = setInterval(loadFleet, 5000);
    }
    if (current === "user" && arg) {
      $("user-id").value = decodeURIComponent(arg);
      inspect(decodeURIComponent(arg));
    }
    if (current === "conversation" && arg) {
      $("conv-id").value = decodeURIComponent(arg);
      openConversation(decodeURIComponent(arg), null);
    }
    if (current === "dead-letters") loadDeadLetters();
  }

  // -- user inspector ----------------------------------------------------------------------------

  let inspected = null;

  async function inspect(userId) {
    $("user-error").textContent = "";
    $("user-out").hidden = true;
    let body;
    try {
      body = await api("/ops/api/user/" + encodeURIComponent(userId));
    } catch (e) {
      $("user-error").textContent = e.message;
      return;
    }
    inspected = body.user_id;
    renderUser(body);
    $("user-out").hidden = false;
    $("user-out").dataset.loaded = String(Date.now());
  }

  function renderUser(u) {
    const c = u.counts;
    const g = u.gate || {};
    const lanes = g.lanes ? Object.entries(g.lanes).map(([l, w]) => "lane " + l + ": " + w).join(", ") : "—";
    $("user-summary").replaceChildren(
      el("span", {}, "user ", el("b", { id: "sum-user" }, u.user_id)),
      el("span", {}, "version (stored) ", el("b", { id: "sum-version" }, u.version)),
      el("span", {}, "structure version ", el("b", {}, u.structure_version)),
      el("span", {}, "state version ", el("b", { id: "sum-state-version" }, u.state_version)),
      el("span", {}, "rows: ", el("b", {}, u.rows_stored), " stored, ", el("b", {}, u.rows_in_state), " in state"),
      el(
        "span",
        { id: "sum-drift", class: c.drifted || c.missing_in_store ? "bad" : "good" },
        c.drifted + " drifted, " + c.missing_in_store + " missing in store, " + c.unknown_to_state + " unknown to state"
      ),
      el(
        "span",
        { id: "sum-gate" },
        "partition ",
        el("b", {}, g.partition),
        " · gate hi ",
        el("b", { id: "gate-hi" }, g.hi),
        " (" + lanes + ")",
        " · pending ",
        el("b", {}, g.pending),
        " · owner ",
        el("b", {}, (g.owners || []).join(", ") || "—")
      )
    );
    fill(
      $("badge").tBodies[0],
      u.badge.map((f) =>
        el("tr", { class: f.differs ? "diff" : "", "data-field": f.name }, el("td", {}, f.name), el("td", {}, f.stored), el("td", {}, f.recomputed))
      )
    );
    const blocks = u.rows.map((row) => {
      const table = el("table", { class: "diff-table" });
      table.append(el("thead", {}, el("tr", {}, el("th", {}, "field"), el("th", {}, "stored"), el("th", {}, "recomputed"))));
      const tbody = el("tbody");
      for (const f of row.fields) {
        const cls = f.differs ? "diff" : f.knowable ? "" : "unknowable";
        tbody.append(
          el(
            "tr",
            { class: cls, "data-field": f.name, title: f.knowable ? "" : "not knowable from state (shown, never a difference)" },
            el("td", {}, f.name),
            el("td", { class: "stored" }, f.stored),
            el("td", { class: "recomputed" }, f.recomputed)
          )
        );
      }
      table.append(tbody);
      const details = el(
        "details",
        { class: "row " + row.status, "data-cid": row.conversation_id, "data-status": row.status },
        el("summary", {}, el("code", {}, row.conversation_id), " ", el("span", { class: "status" }, row.status.replaceAll("_", " "))),
        table
      );
      details.open = row.status !== "same";
      return details;
    });
    $("rows").replaceChildren(...blocks);
    renderFrames($("frames-delta"), u.frames, "session_delta");
    renderFrames($("frames-badge"), u.frames, "badge");
  }

  function renderFrames(box, frames, kind) {
    if (!frames || frames.error) {
      box.replaceChildren(el("p", { class: "error" }, frames ? frames.error : "unavailable"));
      return;
    }
    const items = frames[kind] || [];
    if (!items.length) {
      box.replaceChildren(el("p", {}, "none in the last " + frames.scan_records + " records of the partition"));
      return;
    }
    box.replaceChildren(
      ...items
        .slice()
        .reverse()
        .map((r) => {
          const f = r.frame || {};
          const head =
            "offset " + r.offset + " · " + new Date(r.timestamp_ms).toLocaleTimeString() + " · version " + show(f.projection_mailbox_seq) +
            " (prev " + show(f.prev_projection_mailbox_seq) + ")" + (f.correction ? " · CORRECTION" : "") +
            (f.conversations ? " · " + f.conversations.length + " rows" : "") +
            (f.total_unread !== undefined ? " · unread " + f.total_unread : "");
          return el(
            "details",
            { class: "frame" + (f.correction ? " correction" : ""), "data-kind": kind, "data-correction": f.correction ? "1" : "0" },
            el("summary", {}, head),
            el("pre", {}, JSON.stringify(f, null, 1))
          );
        })
    );
  }

  async function act(action) {
    if (!inspected) return;
    const out = $("action-result");
    out.textContent = action + "…";
    out.className = "";
    try {
      const r = await api("/ops/api/user/" + inspected + "/" + action, { method: "POST" });
      out.textContent =
        action + ": " + (r.written ? r.rows + " rows written at version " + r.version : "nothing to correct") +
        (r.frames ? " · frames: " + r.frames.session_delta + " session-delta, " + r.frames.badge + " badge" : "");
      out.className = "good";
      out.dataset.done = action;
      await inspect(inspected);
    } catch (e) {
      out.textContent = action + " refused: " + e.message;
      out.className = "bad";
      out.dataset.done = action + "-refused";
    }
  }

  // -- conversation --------------------------------------------------------------------------------

  async function openConversation(cid, after) {
    $("conv-error").textContent = "";
    let body;
    try {
      const q = after ? "?after_user_id=" + encodeURIComponent(after) : "";
      body = await api("/ops/api/conversation/" + encodeURIComponent(cid) + q);
    } catch (e) {
      $("conv-error").textContent = e.message;
      return;
    }
    const h = body.head;
    $("conv-head").replaceChildren(
      el("span", {}, "conversation ", el("code", {}, body.conversation_id)),
      h
        ? el("span", { id: "conv-head-seq" }, "head seq ", el("b", {}, h.latest_conversation_seq), " · message ", el("code", {}, h.last_message_id), " · activity ", el("code", {}, h.last_activity_id))
        : el("span", {}, "no head in the MessageStore")
    );
    const rows = body.members.map((m) => {
      const s = m.stored || {};
      const link = el("a", { href: "#user=" + m.user_id }, m.user_id);
      return el(
        "tr",
        { "data-user": m.user_id },
        el("td", {}, link), el("td", {}, m.role), el("td", {}, m.state), el("td", {}, m.joined_at), el("td", {}, m.left_at),
        el("td", {}, m.read_seq_state), el("td", {}, s.unread_count), el("td", {}, s.unread_exact), el("td", {}, s.mention_count),
        el("td", {}, s.read_conversation_seq), el("td", {}, s.latest_conversation_seq), el("td", {}, m.user_version)
      );
    });
    const tbody = $("members").tBodies[0];
    if (after) tbody.append(...rows);
    else fill(tbody, rows);
    const more = $("conv-more");
    more.hidden = !body.has_more;
    more.onclick = () => openConversation(cid, body.next_after_user_id);
    $("conv-out").hidden = false;
  }

  // -- fleet -----------------------------------------------------------------------------------------

  let charts = null;

  function chart(target, title, label, color) {
    return new uPlot(
      {
        title: title,
        width: 520,
        height: 220,
        scales: { x: { time: true } },
        series: [{}, { label: label, stroke: color, width: 2, spanGaps: true }],
        axes: [{}, { size: 60 }],
      },
      [[], []],
      target
    );
  }

  async function loadFleet() {
    let f, s;
    try {
      [f, s] = await Promise.all([api("/ops/api/fleet"), api("/ops/api/series")]);
    } catch (e) {
      $("fleet-summary").textContent = e.message;
      return;
    }
    $("fleet-summary").replaceChildren(
      el("span", {}, "serving namespace ", el("b", { id: "serving" }, f.serving_namespace)),
      el("span", {}, "base ", el("b", {}, f.base_namespace)),
      el("span", {}, "workers ", el("b", {}, f.workers.length)),
      el("span", {}, "lag ", el("b", { id: "total-lag" }, f.totals.lag), " records"),
      el("span", {}, "applied ", el("b", {}, f.totals.applied)),
      f.offsets_error ? el("span", { class: "bad" }, "Kafka offsets: " + f.offsets_error) : el("span"),
      el("span", { id: "fleet-at" }, "at " + fmtTime(f.at))
    );
    fill(
      $("partitions").tBodies[0],
      f.partitions.map((p) =>
        el(
          "tr",
          { "data-partition": String(p.partition), class: p.owners.length === 1 ? "" : "warn" },
          el("td", {}, p.partition),
          el("td", { class: "owner" }, p.owners.length ? p.owners.join(", ") : "no worker reports it"),
          el("td", {}, p.hi),
          el("td", {}, p.lanes ? Object.entries(p.lanes).map(([l, w]) => l + ": " + w).join(", ") : null),
          el("td", {}, p.pending),
          el("td", {}, p.watermark_lag),
          el("td", {}, p.committed),
          el("td", {}, p.end),
          el("td", { class: "lag" }, p.lag),
          el("td", {}, p.last_flush ? fmtTime(p.last_flush) : null),
          el("td", {}, p.dead_letters),
          el("td", {}, p.drift_ratio),
          el("td", {}, p.owed_rows)
        )
      )
    );
    fill(
      $("workers").tBodies[0],
      f.workers.map((w) =>
        el(
          "tr",
          { class: w.up ? "" : "bad" },
          el("td", {}, w.url), el("td", {}, w.up ? "up" : "down: " + w.error), el("td", {}, w.partitions.join(", ")),
          el("td", {}, w.applied), el("td", {}, w.pending), el("td", {}, w.dead_letters), el("td", {}, w.flushes),
          el("td", {}, w.drift_ratio), el("td", {}, w.owed_rows_total), el("td", {}, w.mirror_failures)
        )
      )
    );
    fill(
      $("rebuilds").tBodies[0],
      f.rebuilds.length
        ? f.rebuilds.map((r) =>
            el("tr", {}, el("td", {}, r.url), el("td", {}, r.namespace), el("td", {}, r.done), el("td", {}, r.items),
              el("td", {}, r.ratio === null ? null : (r.ratio * 100).toFixed(0) + " %"),
              el("td", { class: "diff" }, r.diff
                ? `${r.diff.rows_added} added, ${r.diff.rows_removed} removed, ${r.diff.rows_changed} changed, ` +
                  `${r.diff.badges_differing} badges`
                : "not compared yet"))
          )
        : [el("tr", {}, el("td", { colSpan: 6 }, "no rebuild reports to the configured metrics URLs"))]
    );
    if (typeof uPlot !== "undefined") {
      if (!charts) {
        charts = {
          throughput: chart($("chart-throughput"), "Throughput (entries applied / s)", "entries/s", "#2a7"),
          lag: chart($("chart-lag"), "Lag (records not committed)", "records", "#c53"),
        };
      }
      charts.throughput.setData([s.t, s.applied_per_s]);
      charts.lag.setData([s.t, s.lag]);
      $("tab-fleet").dataset.samples = String(s.t.length);
    }
  }

  // -- dead letters -----------------------------------------------------------------------------------

  async function loadDeadLetters() {
    $("dl-error").textContent = "";
    const q = new URLSearchParams();
    if ($("dl-partition").value.trim()) q.set("partition", $("dl-partition").value.trim());
    q.set("limit", $("dl-limit").value.trim() || "50");
    let body;
    try {
      body = await api("/ops/api/dead-letters?" + q.toString());
    } catch (e) {
      $("dl-error").textContent = e.message;
      return;
    }
    fill(
      $("dead-letters").tBodies[0],
      body.items.map((d) => {
        const open = el("button", { type: "button", class: "open-dl" }, "Open");
        open.onclick = () => showDeadLetter(d);
        return el(
          "tr",
          { "data-offset": String(d.dlt_offset), "data-dlt-partition": String(d.dlt_partition) },
          el("td", {}, new Date(d.timestamp_ms).toLocaleString()),
          el("td", {}, d.dlt_partition + " / " + d.dlt_offset),
          el("td", {}, show(d.source_partition) + " / " + show(d.source_offset)),
          el("td", { class: "reason" }, d.reason),
          el("td", {}, open)
        );
      })
    );
    $("tab-dead-letters").dataset.loaded = String(body.items.length);
  }

  function showDeadLetter(d) {
    $("dl-reason").textContent = show(d.reason);
    $("dl-source").textContent =
      show(d.source_topic) + " partition " + show(d.source_partition) + " offset " + show(d.source_offset) + " key " + show(d.key);
    $("dl-record").textContent = d.record_encoding === "base64" ? "(base64) " + show(d.record) : show(d.record);
    $("dl-raw").textContent = d.raw;
    $("dl-detail").hidden = false;
  }

  // -- start -----------------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", async () => {
    $("user-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const id = $("user-id").value.trim();
      if (window.location.hash === "#user=" + id) inspect(id);
      else window.location.hash = "user=" + id;
    });
    $("conv-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const id = $("conv-id").value.trim();
      if (window.location.hash === "#conversation=" + id) openConversation(id, null);
      else window.location.hash = "conversation=" + id;
    });
    $("dl-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      loadDeadLetters();
    });
    $("reconcile").addEventListener("click", () => act("reconcile"));
    $("rebuild").addEventListener("click", () => act("rebuild"));
    $("logout").addEventListener("click", async () => {
      await api("/ops/logout", { method: "POST" });
      window.location.reload();
    });
    window.addEventListener("hashchange", route);
    try {
      const me = await api("/ops/api/whoami");
      $("whoami").textContent = "operator: " + me.operator;
    } catch (e) {
      $("whoami").textContent = e.message;
    }
    route();
    document.body.dataset.ready = "1";
  });
})();
