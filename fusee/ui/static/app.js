// fusee ui: the runs page and the run page, over the JSON API of this server.
// Plain JavaScript, no build step and nothing from another site. Every text
// from the store goes into the page as text (textContent), never as HTML.
"use strict";

const STATUSES_FALLBACK = ["cancelled", "completed", "continued", "diverged", "failed", "paused", "queued", "running", "suspended"];
// The statuses of a run that has not ended: a cancel applies to these.
const UNFINISHED = ["queued", "running", "suspended", "paused", "diverged"];

// --- small helpers ---------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "style") node.setAttribute("style", v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function api(path) {
  const r = await fetch(path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  const body = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) throw new Error(body.error || `${r.status} ${r.statusText}`);
  return body;
}

// POSTs an action as JSON (the server refuses anything else: a foreign
// page's form cannot act on runs); throws the server's error message.
async function post(path, body) {
  const r = await fetch(path, {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", Accept: "application/json" }, body: JSON.stringify(body || {}),
  });
  const answer = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) throw new Error(answer.error || `${r.status} ${r.statusText}`);
  return answer;
}

// A timer that reloads a page's data (the queues and schedules pages), stopped
// when another page is shown.
const poller = {
  timer: null,
  every(ms, fn) {
    this.stop();
    this.timer = setInterval(fn, ms);
  },
  stop() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  },
};

function fmtTime(ms) {
  if (ms === null || ms === undefined) return "";
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

function fmtDur(ms) {
  if (ms === null || ms === undefined || !isFinite(ms)) return "";
  if (ms < 1) return `${Math.round(ms * 1000)} µs`;
  if (ms < 1000) return `${Math.round(ms * 10) / 10} ms`;
  const s = ms / 1000;
  if (s < 60) return `${Math.round(s * 100) / 100} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.round(s % 60)} s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${m % 60} min`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

function badge(status) {
  return el("span", { class: `badge status-${String(status).replace(/\s+/g, "-")}`, text: status });
}

function json(value) {
  return el("pre", { class: "json", text: JSON.stringify(value, null, 2) });
}

function jsonView(label, value, open) {
  if (value === null || value === undefined) return null;
  return el("details", { class: "json-view", open: !!open }, el("summary", { text: label }), json(value));
}

function errorText(error) {
  if (!error) return "";
  return error.type ? `${error.type}: ${error.message}` : String(error.message ?? error);
}

function runLink(id, text) {
  return el("a", { href: `/runs/${encodeURIComponent(id)}`, class: "run-link", text: text ?? id });
}

const live = {
  source: null,
  open(url, handlers) {
    this.close();
    const dot = document.getElementById("live");
    const source = new EventSource(url, { withCredentials: true });
    source.onopen = () => dot.classList.add("on");
    source.onerror = () => dot.classList.remove("on");
    for (const [kind, fn] of Object.entries(handlers)) {
      source.addEventListener(kind, (e) => fn(JSON.parse(e.data)));
    }
    this.source = source;
  },
  close() {
    if (this.source) this.source.close();
    this.source = null;
    document.getElementById("live").classList.remove("on");
  },
};

function showError(main, message) {
  main.replaceChildren(el("div", { class: "error-box" }, el("strong", { text: "Error: " }), message));
}

// --- the runs page ---------------------------------------------------------------------

const FILTERS = ["status", "workflow", "attr", "since", "until"];

function apiQuery(params) {
  // The page's address keeps what the person typed; the API takes times in ms.
  // Top-level runs by default, as Temporal's list: children=1 shows theirs too.
  const q = new URLSearchParams({ children: params.get("children") === "1" ? "1" : "0" });
  for (const key of FILTERS) {
    const v = params.get(key);
    if (!v) continue;
    if (key === "since" || key === "until") {
      const ms = new Date(v).getTime();
      if (!isNaN(ms)) q.set(key, String(ms));
    } else {
      q.set(key, v);
    }
  }
  return q;
}

// Cancel or resume every run the page's filter matches: counted first (a dry
// run), confirmed with that count, then done by the worker; the rows update live.
function bulkBar(params) {
  const message = el("p", { class: "form-message", id: "bulk-message", role: "status" });
  const filters = () => {
    const body = {};
    for (const key of ["status", "workflow", "attr"]) if (params.get(key)) body[key] = params.get(key);
    for (const key of ["since", "until"]) {
      const ms = params.get(key) ? new Date(params.get(key)).getTime() : NaN;
      if (!isNaN(ms)) body[key] = ms;
    }
    return body;
  };
  const runs = (n) => `${n} run${n === 1 ? "" : "s"}`;
  const act = async (verb, past) => {
    message.textContent = "counting…";
    try {
      const dry = await post(`/api/bulk/${verb}`, { ...filters(), dry_run: true });
      if (dry.count === 0) {
        message.textContent = `no run this filter matches can be ${past}`;
        return;
      }
      const ask = `${verb === "cancel" ? "Cancel" : "Resume"} ${runs(dry.count)} this filter matches (child runs included)?`;
      if (!confirm(ask)) {
        message.textContent = `nothing ${past}`;
        return;
      }
      message.textContent = `${verb}…`;
      const done = await post(`/api/bulk/${verb}`, filters());
      const skipped = Object.keys(done.skipped).length;
      message.textContent = `${past} ${runs(done.count)}` + (skipped ? `; ${skipped} skipped (they changed meanwhile)` : "");
    } catch (err) {
      message.textContent = err.message;
    }
  };
  return el("div", { class: "bulk", id: "bulk" },
    el("span", { class: "muted small", text: "Every run this filter matches: " }),
    el("button", { type: "button", id: "bulk-cancel", class: "danger", onclick: () => act("cancel", "cancelled"), text: "Cancel all…" }), " ",
    el("button", { type: "button", id: "bulk-resume", onclick: () => act("resume", "resumed"), text: "Resume all…" }),
    message);
}

async function runsPage(main, info) {
  document.title = "runs · fusee";
  const params = new URLSearchParams(location.search);
  const status = el("select", { name: "status", id: "f-status" }, el("option", { value: "", text: "any status" }),
    (info.statuses || STATUSES_FALLBACK).map((s) => el("option", { value: s, text: s, selected: params.get("status") === s })));
  const form = el("form", { class: "filters", id: "filters", onsubmit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) q.set(k, v);
    history.pushState(null, "", `/?${q}`);
    route();
  } },
    el("label", {}, "Status ", status),
    el("label", {}, "Workflow ", el("input", { name: "workflow", id: "f-workflow", value: params.get("workflow") || "", placeholder: "checkout" })),
    el("label", {}, "Attribute ", el("input", { name: "attr", id: "f-attr", value: params.get("attr") || "", placeholder: "customer=ada" })),
    el("label", {}, "Started from ", el("input", { type: "datetime-local", step: "1", name: "since", id: "f-since", value: params.get("since") || "" })),
    el("label", {}, "to ", el("input", { type: "datetime-local", step: "1", name: "until", id: "f-until", value: params.get("until") || "" })),
    el("label", { title: "runs started by another run's ctx.child" }, "Child runs ", el("input", { type: "checkbox", name: "children", value: "1", id: "f-children", checked: params.get("children") === "1" })),
    el("button", { type: "submit", id: "f-apply", text: "Apply" }),
    el("a", { href: "/", class: "clear", text: "clear" }));
  form.elements.children.addEventListener("change", () => form.requestSubmit());
  const tbody = el("tbody");
  const table = el("table", { class: "runs", id: "runs" },
    el("thead", {}, el("tr", {}, ["id", "workflow", "status", "run", "started", "finished", "took", "attributes", "parent"].map((h) => el("th", { text: h })))),
    tbody);
  const pager = el("nav", { class: "pager" });
  const count = el("span", { class: "muted", id: "count" });
  const bulk = (info.actions || []).includes("bulk") ? bulkBar(params) : null;
  const warnings = el("div", { id: "version-warnings" });
  main.replaceChildren(el("h1", { text: "Runs" }), warnings, form, ...(bulk ? [bulk] : []), el("div", { class: "table-wrap" }, table), el("div", { class: "under" }, count, pager));
  // A version with unfinished runs and no worker: its pinned runs wait.
  api("/api/versions").then((lines) => warnings.replaceChildren(...lines.filter((l) => l.warning)
    .map((l) => el("div", { class: "error-box version-warning", text: `version ${l.version}: ${l.warning}` }))), () => {});

  const q = apiQuery(params);
  q.set("limit", params.get("limit") || "50");
  if (params.get("after")) q.set("after", params.get("after"));
  let page;
  try {
    page = await api(`/api/runs?${q}`);
  } catch (e) {
    showError(main, e.message);
    return;
  }
  const rows = new Map();
  const render = (run) => {
    const took = run.finished_ms !== null ? fmtDur(run.finished_ms - run.started_ms) : "";
    const attrs = Object.keys(run.attributes).length ? JSON.stringify(run.attributes) : "";
    return el("tr", { "data-id": run.id, "data-started": run.started_ms },
      el("td", {}, runLink(run.id)), el("td", { text: run.workflow }), el("td", {}, badge(run.status)),
      el("td", { text: run.run }), el("td", { text: fmtTime(run.started_ms) }), el("td", { text: fmtTime(run.finished_ms) }),
      el("td", { text: took }), el("td", { class: "attrs", text: attrs }), el("td", {}, run.parent ? runLink(run.parent) : ""));
  };
  for (const run of page.runs) {
    const tr = render(run);
    rows.set(run.id, tr);
    tbody.append(tr);
  }
  const firstPage = !params.get("after");
  const setCount = () => { count.textContent = rows.size ? `${rows.size} run${rows.size === 1 ? "" : "s"} on this page` : "no runs match"; };
  setCount();
  if (!firstPage) {
    const first = new URLSearchParams(params);
    first.delete("after");
    pager.append(el("a", { href: `/?${first}`, id: "first-page", text: "← first page" }));
  }
  if (page.next) {
    const next = new URLSearchParams(params);
    next.set("after", page.next);
    pager.append(el("a", { href: `/?${next}`, id: "next-page", text: "next page →" }));
  }

  const events = apiQuery(params);
  events.set("limit", q.get("limit"));
  events.set("ids", [...rows.keys()].join(","));
  live.open(`/api/runs/events?${events}`, {
    runs: (data) => {
      for (const run of data.runs) {
        const old = rows.get(run.id);
        const tr = render(run);
        if (old) {
          if (old.textContent !== tr.textContent) {
            old.replaceWith(tr);
            rows.set(run.id, tr);
            tr.classList.add("flash");
          }
        } else if (firstPage) {
          // Newest first: before the first row that started earlier.
          const after = [...tbody.children].find((r) =>
            Number(r.dataset.started) < run.started_ms ||
            (Number(r.dataset.started) === run.started_ms && r.dataset.id < run.id));
          tbody.insertBefore(tr, after || null);
          rows.set(run.id, tr);
          tr.classList.add("flash");
        }
      }
      setCount();
    },
  });
}

// --- the run page ----------------------------------------------------------------------

const KIND_LABEL = { step: "step", timer: "timer", wait: "wait", child: "child", send: "send", value: "value",
  attributes: "attributes", event: "event", completion: "completion", update: "update" };

function mergeByKey(list, items) {
  for (const item of items || []) {
    const i = list.findIndex((x) => x.key === item.key);
    if (i >= 0) list[i] = item; else list.push(item);
  }
}

function applyChanges(detail, changes) {
  for (const k of ["start", "outcome", "cancel", "records", "last_lsn", "gaps"]) if (k in changes) detail[k] = changes[k];
  if ("run" in changes) { detail.run = changes.run; detail.divergence = changes.divergence; }
  if ("children" in changes) detail.children = changes.children;
  for (const k of ["operations", "signals", "updates", "streams", "patches", "corrupt"]) mergeByKey(detail[k], changes[k]);
  detail.operations.sort((a, b) => a.seq - b.seq);
  detail.anchors.push(...(changes.anchors || []));
}

// Where each record lies in time: the times the records carry (anchors), and
// in between, records placed by their log position.
function clockOf(detail) {
  const anchors = detail.anchors.slice();
  const t0 = anchors.length ? anchors[0][1] : detail.run.started_ms;
  let end;
  if (detail.outcome) end = Math.max(detail.outcome.finished_ms, anchors.length ? anchors[anchors.length - 1][1] : t0);
  else {
    end = Math.max(Date.now(), anchors.length ? anchors[anchors.length - 1][1] : t0);
    anchors.push([detail.last_lsn + 1, end]);
  }
  if (!anchors.length) anchors.push([0, t0]);
  const at = (lsn) => {
    if (lsn === null || lsn === undefined) return end;
    if (lsn <= anchors[0][0]) return anchors[0][1];
    for (let i = 1; i < anchors.length; i++) {
      const [l2, m2] = anchors[i];
      if (lsn <= l2) {
        const [l1, m1] = anchors[i - 1];
        return l2 === l1 ? m2 : m1 + (m2 - m1) * (lsn - l1) / (l2 - l1);
      }
    }
    return end;
  };
  const span = Math.max(end - t0, 1);
  const pct = (ms) => Math.min(100, Math.max(0, (ms - t0) / span * 100));
  return { t0, end, span, at, pct };
}

function bar(clock, from, to, cls, title) {
  const left = clock.pct(from);
  const width = Math.max(clock.pct(to) - left, 0.5);
  return el("div", { class: `bar ${cls}`, style: `left:${left}%;width:${width}%`, title });
}

function opBars(op, clock, detail) {
  const bars = [];
  const ended = op.end_lsn !== null;
  const endMs = ended ? clock.at(op.end_lsn) : clock.end;
  if (op.kind === "step") {
    for (const a of op.attempts) {
      const cls = a.status === "ok" ? "ok" : a.status === "running" ? "running" : a.status === "cancelled" ? "cancelled" : "failed";
      const title = `attempt ${a.attempt}: ${a.status}${a.error ? ` (${errorText(a.error)})` : ""}`;
      let to;
      if (a.started_ms !== null && a.run_ms !== null) {
        // The attempt's own times: a bar as long as it ran.
        if (a.due_ms !== null && a.started_ms > a.due_ms) bars.push(bar(clock, a.due_ms, a.started_ms, "queue", `attempt ${a.attempt} queued ${fmtDur(a.queue_ms)}`));
        to = a.started_ms + a.run_ms;
        bars.push(bar(clock, a.started_ms, to, `attempt ${cls}`, title));
      } else if (a.lsn !== null) {
        // No time of its own: a point where its record lies, never a bar
        // stretched to the next time the journal holds.
        to = clock.at(a.lsn);
        bars.push(el("div", { class: `mark point attempt ${cls}`, style: `left:${clock.pct(to)}%`, title: `${title}, at about ${fmtTime(to)} (no time of its own in the journal)` }));
      } else {
        // In flight: from where it began to now.
        to = clock.end;
        bars.push(bar(clock, a.due_ms ?? clock.at(a.after_lsn), to, `attempt ${cls}`, title));
      }
      if (a.paused) bars.push(bar(clock, to, a.resumed_lsn ? clock.at(a.resumed_lsn) : clock.end, "paused", "paused: waiting for a resume"));
      else if (a.retry_at_ms !== null) bars.push(bar(clock, to, Math.max(to, a.retry_at_ms), "backoff", `retry at ${fmtTime(a.retry_at_ms)}`));
    }
    if (!op.attempts.length) bars.push(bar(clock, clock.at(op.begin_lsn), endMs, "running", "running"));
  } else if (["value", "attributes", "event", "send"].includes(op.kind)) {
    const t = clock.at(op.first_lsn);
    bars.push(el("div", { class: "mark point", style: `left:${clock.pct(t)}%`, title: `${op.kind} at ${fmtTime(t)}` }));
  } else {
    const from = clock.at(op.first_lsn);
    let to = endMs;
    if (op.kind === "timer" && !ended && op.fire_at_ms) to = Math.max(op.fire_at_ms, from);
    const cls = `${op.kind} ${ended ? "" : "open"} ${op.error ? "failed" : ""}`;
    bars.push(bar(clock, from, Math.min(to, Math.max(clock.end, to)), cls, `${op.kind} ${op.name}: ${op.status}`));
  }
  return bars;
}

function opDetails(op) {
  const rows = [];
  const fact = (k, v) => (v === null || v === undefined || v === "" ? null : el("div", { class: "fact" }, el("span", { class: "k", text: k }), el("span", { class: "v" }, v)));
  rows.push(fact("position", `seq ${op.seq} (log ${op.first_lsn}–${op.last_lsn})`));
  if (op.kind === "timer") rows.push(fact("fires at", fmtTime(op.fire_at_ms)));
  if (op.kind === "wait") {
    rows.push(fact("signal", op.signal));
    rows.push(fact("deadline", op.deadline_ms ? fmtTime(op.deadline_ms) : "none"));
  }
  if (op.kind === "child" && op.child) rows.push(fact("child run", runLink(op.child.id)), fact("detached", op.child.detached ? "yes" : "no"));
  if (op.kind === "send") rows.push(fact("to", runLink(op.target)));
  if (op.kind === "update") rows.push(fact("update", `#${op.ordinal} (in Updates below)`));
  if (op.cut_off) rows.push(fact("ended", "with the run: the journal records no end of its own"));
  if (op.progress !== undefined && op.progress !== null) rows.push(fact("progress", JSON.stringify(op.progress)));
  if (op.attempts.length && op.kind === "step") {
    rows.push(el("table", { class: "attempts" },
      el("thead", {}, el("tr", {}, ["attempt", "status", "error", "queue delay", "run time", "retry at", "progress"].map((h) => el("th", { text: h })))),
      el("tbody", {}, op.attempts.map((a) => el("tr", { class: `attempt-row ${a.status}` },
        el("td", { text: a.attempt }), el("td", {}, badge(a.paused ? "paused" : a.status)),
        el("td", { class: "attempt-error", text: errorText(a.error) }),
        el("td", { text: a.queue_ms !== null ? fmtDur(a.queue_ms) : "—" }),
        el("td", { text: a.run_ms !== null ? fmtDur(a.run_ms) : "—" }),
        el("td", { text: a.paused ? "after a resume" : fmtTime(a.retry_at_ms) }),
        el("td", { text: a.progress !== null ? `${JSON.stringify(a.progress)} (${a.heartbeats} heartbeats)` : "" }))))));
    if (op.attempts.some((a) => a.run_ms === null)) {
      rows.push(el("p", { class: "muted small", text: "Queue delay and run time show where the journal records them (a step's time)." }));
    }
  }
  if (op.kind === "completion" && op.attempts.length) rows.push(fact("attempts", op.attempts.map((a) => `#${a.attempt} ${a.status}`).join(", ")));
  rows.push(jsonView("input", op.input, false));
  rows.push(jsonView("result", op.result, true));
  if (op.error) rows.push(el("div", { class: "error-box" }, errorText(op.error)));
  return el("div", { class: "op-details" }, rows);
}

function waterfall(detail, expanded, rerender) {
  const clock = clockOf(detail);
  const ticks = el("div", { class: "axis" }, [0, 25, 50, 75, 100].map((p) =>
    el("span", { class: "tick", style: `left:${p}%`, text: p === 0 ? fmtTime(clock.t0).slice(11) : `+${fmtDur(clock.span * p / 100)}` })));
  const head = el("div", { class: "wf-row wf-head" }, el("span", { class: "c-seq", text: "seq" }), el("span", { class: "c-kind", text: "kind" }),
    el("span", { class: "c-name", text: "name" }), el("span", { class: "c-status", text: "status" }), el("div", { class: "track" }, ticks));
  const runMarks = [bar(clock, clock.t0, clock.end, `run ${detail.outcome ? detail.outcome.status : "open"}`, "the run")];
  for (const s of detail.signals) {
    runMarks.push(el("div", { class: "mark signal", style: `left:${clock.pct(clock.at(s.lsn))}%`, title: `signal ${s.name}` }));
  }
  if (detail.cancel) runMarks.push(el("div", { class: "mark cancel", style: `left:${clock.pct(clock.at(detail.cancel.lsn))}%`, title: "cancelled" }));
  const rows = [head, el("div", { class: "wf-row run-row" }, el("span", { class: "c-seq" }), el("span", { class: "c-kind", text: "run" }),
    el("span", { class: "c-name", text: detail.run.workflow }), el("span", { class: "c-status" }, badge(detail.outcome ? detail.outcome.status : detail.run.status)),
    el("div", { class: "track" }, runMarks))];
  const gaps = detail.gaps || [];
  const gapRow = (seq) => el("div", { class: "wf-row gap-row", "data-seq": seq },
    el("span", { class: "c-seq", text: seq }), el("span", { class: "c-kind", text: "—" }),
    el("span", { class: "c-name muted", text: detail.outcome ? "no record: started, never recorded" : "no record yet: in flight" }),
    el("span", { class: "c-status" }), el("div", { class: "track" }));
  let g = 0;
  for (const op of detail.operations) {
    // Every position has a row: one without a record of its own (a step in
    // flight) gets a row that says so, never a silent gap.
    while (g < gaps.length && gaps[g] < op.seq) rows.push(gapRow(gaps[g++]));
    const open = expanded.has(op.seq);
    const retries = op.attempts.filter((a) => a.status === "failed").length;
    const row = el("div", { class: `wf-row op-row kind-${op.kind}${open ? " open" : ""}`, "data-seq": op.seq, tabindex: "0",
      onclick: () => { if (open) expanded.delete(op.seq); else expanded.add(op.seq); rerender(); } },
    el("span", { class: "c-seq", text: op.seq }), el("span", { class: "c-kind", text: KIND_LABEL[op.kind] || op.kind }),
    el("span", { class: "c-name op-name", text: op.kind === "child" && op.child ? `${op.name} ${op.child.id}` : op.name }),
    el("span", { class: "c-status" }, badge(op.status), retries && op.kind === "step" ? el("span", { class: "retries", text: ` ${retries} failed` }) : null),
    el("div", { class: "track" }, opBars(op, clock, detail)));
    rows.push(row);
    const lastError = [...op.attempts].reverse().find((a) => a.error);
    if (lastError && !open) rows.push(el("div", { class: "wf-note attempt-error", text: `attempt ${lastError.attempt}: ${errorText(lastError.error)}` }));
    if (open) rows.push(opDetails(op));
  }
  while (g < gaps.length) rows.push(gapRow(gaps[g++]));
  return el("section", { class: "waterfall", id: "timeline" },
    el("h2", { text: "Timeline" }),
    el("p", { class: "muted small", text: "One row per position of the journal: each operation, an update's handler at its place. Bars are placed by the times the journal records; a step without a time of its own is a point where its record lies, between the times around it. Click a row for its attempts and payloads." }),
    el("div", { class: "legend" }, ["ok", "failed", "running", "backoff", "paused", "timer", "wait", "child"].map((c) => el("span", {}, el("i", { class: `swatch ${c}` }), c))),
    rows);
}

function tree(nodes) {
  if (!nodes.length) return null;
  return el("ul", { class: "tree" }, nodes.map((n) => el("li", { "data-id": n.id },
    runLink(n.id), " ", el("span", { class: "muted", text: n.workflow }), " ", badge(n.status),
    n.detached ? el("span", { class: "muted", text: " detached" }) : null,
    n.more ? el("span", { class: "muted", text: " (its children: on its page)" }) : null,
    tree(n.children))));
}

function runView(detail, expanded, rerender) {
  const r = detail.run;
  const title = el("h1", {}, el("span", { class: "run-id", text: r.id }), " ", badge(r.status));
  const facts = el("dl", { class: "facts" },
    [["workflow", r.workflow], ["run", detail.journal_run !== r.run ? `${detail.journal_run} (latest: ${r.run})` : r.run],
      ["started", fmtTime(r.started_ms)], ["finished", fmtTime(r.finished_ms)],
      ["took", r.finished_ms !== null ? fmtDur(r.finished_ms - r.started_ms) : ""],
      ["wakes", fmtTime(r.wake_ms)], ["parent", r.parent ? runLink(r.parent) : ""],
      ["attributes", Object.keys(r.attributes).length ? JSON.stringify(r.attributes) : ""],
      ["records", detail.records]]
      .filter(([, v]) => v !== "" && v !== null && v !== undefined)
      .map(([k, v]) => [el("dt", { text: k }), el("dd", {}, v)]));
  const parts = [el("p", {}, el("a", { href: "/", text: "← runs" })), title, facts];
  if (detail.journal_warning) {
    parts.push(el("div", { class: "error-box journal-warning", id: "journal-warning" },
      el("strong", { text: "Long journal. " }), detail.journal_warning));
  }
  if (detail.divergence) {
    parts.push(el("div", { class: "error-box divergence", id: "divergence" }, el("strong", { text: "Determinism error. " }),
      detail.divergence.error || el("span", { class: "muted", text: detail.divergence.note })));
  }
  if (r.error) {
    // Paused by a bug in its code: the store keeps what it raised until a resume.
    const last = r.error.trimEnd().split("\n").pop();
    parts.push(el("div", { class: "error-box bug", id: "bug" },
      el("strong", { text: "Paused by a bug in its code. " }), last,
      el("p", { class: "muted", text: "Deploy a fix, then resume the run: it replays on the new code." }),
      el("pre", { class: "traceback", text: r.error })));
  }
  if (detail.outcome) {
    const o = detail.outcome;
    if (o.error) {
      const reason = o.error.message;
      const why = o.status !== "cancelled" ? errorText(o.error) : typeof reason === "string" ? reason : JSON.stringify(reason);
      parts.push(el("div", { class: "error-box", id: "outcome" }, el("strong", { text: `${o.status}: ` }), why,
        o.error.traceback ? el("pre", { class: "traceback", text: o.error.traceback }) : null));
    } else {
      parts.push(el("div", { class: "outcome", id: "outcome" }, el("strong", { text: `${o.status}` }), jsonView("result", o.result, true)));
    }
  }
  // One banner per run: a cancelled run's outcome says why; a cancel the run
  // has not acted on yet (or one it ended before) gets a note of its own.
  if (detail.cancel && !(detail.outcome && detail.outcome.status === "cancelled")) {
    parts.push(el("div", { class: "note-box", id: "cancel-note" }, detail.outcome ? "A cancel was asked for, after the run had ended: " : "Cancel requested: ",
      JSON.stringify(detail.cancel.reason)));
  }
  if (detail.start) parts.push(jsonView("input", detail.start.input, false));
  parts.push(waterfall(detail, expanded, rerender));
  if (detail.children.length) parts.push(el("section", { id: "children" }, el("h2", { text: "Children" }), tree(detail.children)));
  if (detail.signals.length) {
    parts.push(el("section", { id: "signals" }, el("h2", { text: "Signals" }), el("table", { class: "small-table" },
      el("thead", {}, el("tr", {}, ["#", "name", "payload", "taken by"].map((h) => el("th", { text: h })))),
      el("tbody", {}, detail.signals.map((s) => el("tr", {}, el("td", { text: s.ordinal }), el("td", { text: s.name }),
        el("td", {}, json(s.payload)), el("td", { text: s.consumed_by !== null ? `seq ${s.consumed_by}${s.handled ? " and a handler" : ""}` : s.handled ? "a handler (ctx.on_signal)" : s.set_aside ? "set aside: its payload does not fit the wait's type" : "buffered" })))))));
  }
  if (detail.updates.length) {
    parts.push(el("section", { id: "updates" }, el("h2", { text: "Updates" }), el("table", { class: "small-table" },
      el("thead", {}, el("tr", {}, ["#", "name", "id", "payload", "status", "result"].map((h) => el("th", { text: h })))),
      el("tbody", {}, detail.updates.map((u) => el("tr", {}, el("td", { text: u.ordinal }), el("td", { text: u.name }), el("td", { text: u.id }),
        el("td", {}, json(u.payload)), el("td", {}, badge(u.status)), el("td", {}, u.error ? errorText(u.error) : json(u.result))))))));
  }
  if (detail.streams.length) {
    parts.push(el("section", { id: "streams" }, el("h2", { text: "Streams" }), detail.streams.map((s) =>
      el("div", { class: "stream" }, el("h3", {}, s.name, " ", badge(s.status), el("span", { class: "muted", text: ` ${s.chunks} chunk${s.chunks === 1 ? "" : "s"}${s.seq !== null ? `, written by seq ${s.seq}` : ""}` })),
        el("ol", { class: "chunks", start: s.tail.length ? s.tail[0].offset : 0 }, s.tail.map((c) => el("li", {}, el("code", { text: typeof c.payload === "string" ? c.payload : JSON.stringify(c.payload) }))))))));
  }
  if (detail.patches.length) parts.push(el("section", {}, el("h2", { text: "Patches" }), el("ul", {}, detail.patches.map((p) => el("li", { text: `${p.id} at position ${p.at}` })))));
  if (detail.corrupt.length) parts.push(el("section", {}, el("h2", { text: "Unreadable records" }), detail.corrupt.map((c) => el("div", { class: "error-box", text: `log ${c.lsn}: ${c.error}` }))));
  return parts;
}

// The fork form: made once per page, so that what is typed in it survives
// the re-renders live updates cause.
function forkForm(id) {
  const message = el("p", { class: "form-message", id: "fork-message", role: "status" });
  const form = el("form", { class: "action-form", id: "fork", onsubmit: async (e) => {
    e.preventDefault();
    const data = new FormData(form);
    const atText = String(data.get("at") || "").trim();
    const body = { new_id: String(data.get("new_id") || "").trim(), at: /^-?\d+$/.test(atText) ? Number(atText) : atText };
    const inputText = String(data.get("input") || "").trim();
    if (inputText) {
      try { body.input = JSON.parse(inputText); } catch (err) { message.textContent = `the input is not JSON: ${err.message}`; return; }
    }
    message.textContent = "forking…";
    try {
      const answer = await post(`/api/runs/${encodeURIComponent(id)}/fork`, body);
      history.pushState(null, "", `/runs/${encodeURIComponent(answer.id)}`);
      live.close();
      await route();
    } catch (err) {
      message.textContent = err.message;
    }
  } },
  el("label", {}, "new id ", el("input", { name: "new_id", id: "fork-new-id", required: true, value: `${id}-fork` })),
  el("label", {}, "at position ", el("input", { name: "at", id: "fork-at", required: true, placeholder: "seq or step name", size: "14" })),
  el("label", {}, "input ", el("input", { name: "input", id: "fork-input", placeholder: "JSON (default: this run's)", size: "24" })),
  el("button", { type: "submit", id: "fork-submit", text: "Fork" }));
  return el("section", { id: "fork-section" }, el("h2", { text: "Fork" }),
    el("p", { class: "muted small", text: "Start a new run from this run's journal before a position (the seq of a timeline row): the steps before it do not run again; this run is not changed." }),
    form, message);
}

// The names a run knows for its signals: those its waits wait for and
// those it was sent. (The page does not see the workflow's code.)
function signalNames(detail) {
  const names = new Set();
  for (const op of detail.operations) if (op.kind === "wait" && op.signal) names.add(op.signal);
  for (const s of detail.signals) names.add(s.name);
  return [...names].sort();
}

// Signal, cancel and resume: made once per page, like the fork form; `update`
// shows what applies to the run as it changes (cancel until it ends, resume
// while it is paused) and refreshes the signal names.
function runActions(id) {
  const base = `/api/runs/${encodeURIComponent(id)}`;
  const names = el("datalist", { id: "signal-names" });
  const signalMessage = el("p", { class: "form-message", id: "signal-message", role: "status" });
  const signalForm = el("form", { class: "action-form", id: "signal", onsubmit: async (e) => {
    e.preventDefault();
    const data = new FormData(signalForm);
    const name = String(data.get("name") || "").trim();
    const text = String(data.get("payload") || "").trim();
    let payload = null;
    if (text) {
      try { payload = JSON.parse(text); } catch (err) { signalMessage.textContent = `the payload is not JSON: ${err.message}`; return; }
    }
    signalMessage.textContent = "sending…";
    try {
      await post(`${base}/signal`, { name, payload });
      signalMessage.textContent = `signal ${JSON.stringify(name)} sent`;
    } catch (err) {
      signalMessage.textContent = err.message;
    }
  } },
  el("label", {}, "signal ", el("input", { name: "name", id: "signal-name", required: true, list: "signal-names", placeholder: "name", size: "16" })),
  el("label", {}, "payload ", el("input", { name: "payload", id: "signal-payload", placeholder: "JSON (empty: null)", size: "28" })),
  el("button", { type: "submit", id: "signal-submit", text: "Send signal" }), names);

  const runMessage = el("p", { class: "form-message", id: "run-message", role: "status" });
  const act = async (verb, body, done) => {
    runMessage.textContent = `${verb}…`;
    try {
      await post(`${base}/${verb}`, body);
      runMessage.textContent = done;
    } catch (err) {
      runMessage.textContent = err.message;
    }
  };
  const reason = el("input", { name: "reason", id: "cancel-reason", placeholder: "reason", size: "24" });
  const cancel = el("form", { class: "action-form", id: "cancel", onsubmit: (e) => {
    e.preventDefault();
    act("cancel", { reason: reason.value.trim() || null }, "cancel sent: the run stops at its next await");
  } }, el("label", {}, "reason ", reason), el("button", { type: "submit", id: "cancel-submit", class: "danger", text: "Cancel run" }));
  const resume = el("form", { class: "action-form", id: "resume", onsubmit: (e) => {
    e.preventDefault();
    act("resume", {}, "resume sent: its paused steps get a fresh retry budget");
  } }, el("span", { class: "muted small", text: "A step ran out of retries: " }), el("button", { type: "submit", id: "resume-submit", text: "Resume" }));

  const ended = el("p", { class: "muted small", id: "run-ended", text: "This run has ended: it takes no signal, update or cancel. A fork of it goes on from any position." });
  const section = el("section", { id: "run-actions" }, el("h2", { text: "Actions" }),
    el("p", { class: "muted small", text: "The serving worker applies these; the page shows what they do as the journal records it." }),
    signalForm, signalMessage, ended, el("div", { class: "action-row" }, cancel, resume), runMessage);
  let known = "";
  return {
    section,
    update(detail) {
      const status = detail.run.status;
      // A run that has ended takes no signal, nor a cancel.
      const open = UNFINISHED.includes(status);
      signalForm.hidden = !open;
      ended.hidden = open;
      cancel.hidden = !open;
      resume.hidden = status !== "paused";
      const list = signalNames(detail);
      if (list.join("\n") !== known) {
        known = list.join("\n");
        names.replaceChildren(...list.map((n) => el("option", { value: n })));
      }
    },
  };
}

async function runPage(main, id) {
  document.title = `${id} · fusee`;
  const params = new URLSearchParams(location.search);
  const runParam = params.get("run");
  const base = `/api/runs/${encodeURIComponent(id)}`;
  let detail;
  try {
    detail = await api(runParam ? `${base}?run=${encodeURIComponent(runParam)}` : base);
  } catch (e) {
    showError(main, e.message);
    return;
  }
  const expanded = new Set();
  const can = (info && info.actions) || [];
  const actions = can.includes("signal") ? runActions(id) : null;
  const fork = can.includes("fork") ? forkForm(id) : null;
  // Live updates redraw the view only: the forms below it stay in the page,
  // so that a click or what is typed in them is never lost to a redraw.
  const view = el("div", { id: "run-view" });
  main.replaceChildren(view, ...(actions ? [actions.section] : []), ...(fork ? [fork] : []));
  const rerender = () => {
    const y = window.scrollY;
    if (actions) actions.update(detail);
    view.replaceChildren(...runView(detail, expanded, rerender));
    window.scrollTo(0, y);
  };
  rerender();
  const q = new URLSearchParams({ after: String(detail.last_lsn) });
  if (runParam) q.set("run", runParam);
  live.open(`${base}/events?${q}`, {
    run: (changes) => { applyChanges(detail, changes); rerender(); },
    reset: () => { route(); },
    gone: () => { showError(main, `run ${id} is no longer in the store`); live.close(); },
  });
}

// --- the queues page -------------------------------------------------------------------

async function queuesPage(main) {
  document.title = "queues · fusee";
  const tbody = el("tbody");
  const count = el("p", { class: "muted", id: "queues-count" });
  main.replaceChildren(el("h1", { text: "Queues" }),
    el("p", { class: "muted small", text: "Each queue with runs in it: queued (waiting for admission) and running (admitted, not ended), per queue and per key. It reloads every 2 s." }),
    el("div", { class: "table-wrap" }, el("table", { class: "queues", id: "queues" },
      el("thead", {}, el("tr", {}, ["queue", "key", "queued", "running"].map((h) => el("th", { text: h })))), tbody)),
    count);
  const load = async () => {
    let queues;
    try {
      queues = await api("/api/queues");
    } catch (e) {
      poller.stop();
      showError(main, e.message);
      return;
    }
    const rows = [];
    for (const q of queues) {
      rows.push(el("tr", { class: "queue-row", "data-queue": q.queue },
        el("td", {}, el("strong", { text: q.queue })), el("td", { class: "muted", text: "all keys" }),
        el("td", { class: "queued", text: q.queued }), el("td", { class: "running", text: q.running })));
      for (const [key, n] of Object.entries(q.keys || {}).sort()) {
        rows.push(el("tr", { class: "key-row", "data-queue": q.queue, "data-key": key },
          el("td"), el("td", { class: "run-link", text: key }), el("td", { class: "queued", text: n.queued }), el("td", { class: "running", text: n.running })));
      }
    }
    tbody.replaceChildren(...rows);
    count.textContent = queues.length ? `${queues.length} queue${queues.length === 1 ? "" : "s"} with runs` : "no queue has runs in it";
  };
  await load();
  poller.every(2000, load);
}

// --- the schedules page ----------------------------------------------------------------

async function schedulesPage(main, info) {
  document.title = "schedules · fusee";
  const can = (info.actions || []).includes("schedule");
  const tbody = el("tbody");
  const message = el("p", { class: "form-message", id: "schedule-message", role: "status" });
  const count = el("p", { class: "muted", id: "schedules-count" });
  const heads = ["name", "workflow", "ticks", "state", ...(can ? [""] : []), "last tick", "next tick", "last run"];
  // The form that changes a schedule, under the table while one is edited.
  const editing = el("div", { id: "schedule-edit-slot" });
  let load;
  const act = async (name, verb, body = {}) => {
    message.textContent = `${verb}…`;
    try {
      const answer = await post(`/api/schedules/${encodeURIComponent(name)}/${verb}`, body);
      message.replaceChildren(`schedule ${name}: ${verb === "trigger" ? "started " : verb === "delete" ? "deleted" : `${verb}d`}`,
        answer.run_id ? runLink(answer.run_id) : "");
    } catch (err) {
      message.textContent = err.message;
      return false;
    }
    await load();
    return true;
  };
  main.replaceChildren(el("h1", { text: "Schedules" }),
    el("p", { class: "muted small", text: "The store's schedules: those of the code a worker opens with, and those made at run time (here, by the Client or `fusee schedules create`). It reloads every 2 s." }),
    message,
    el("div", { class: "table-wrap" }, el("table", { class: "schedules", id: "schedules" },
      el("thead", {}, el("tr", {}, heads.map((h) => el("th", { text: h })))), tbody)),
    count, ...(can ? [editing, scheduleForm(act)] : []));
  load = async () => {
    let rows;
    try {
      rows = await api("/api/schedules");
    } catch (e) {
      poller.stop();
      showError(main, e.message);
      return;
    }
    tbody.replaceChildren(...rows.map((s) => {
      const state = s.removed ? "removed" : s.paused ? "paused" : "active";
      const buttons = can && !s.removed ? el("td", { class: "schedule-actions" },
        s.paused ? el("button", { type: "button", class: "resume", onclick: () => act(s.name, "resume"), text: "Resume" })
          : el("button", { type: "button", class: "pause", onclick: () => act(s.name, "pause"), text: "Pause" }),
        " ", el("button", { type: "button", class: "trigger", onclick: () => act(s.name, "trigger"), text: "Trigger now" }),
        ...(s.dynamic ? [" ", el("button", { type: "button", class: "edit", onclick: () => editing.replaceChildren(scheduleEditForm(act, s, () => editing.replaceChildren())), text: "Change" }),
          " ", el("button", { type: "button", class: "delete danger", onclick: () => act(s.name, "delete"), text: "Delete" })] : [])) : (can ? el("td") : null);
      return el("tr", { "data-name": s.name },
        el("td", {}, el("strong", { text: s.name })), el("td", { text: s.workflow }), el("td", { class: "spec", text: s.spec }),
        el("td", {}, badge(state)), buttons, el("td", { class: "last-tick", text: fmtTime(s.last_tick_ms) }), el("td", { class: "next-tick", text: fmtTime(s.next_ms) }),
        el("td", { class: "last-run" }, s.last_run ? runLink(s.last_run) : ""));
    }));
    count.textContent = rows.length ? `${rows.length} schedule${rows.length === 1 ? "" : "s"}` : "this store has no schedules";
  };
  await load();
  poller.every(2000, load);
}

// The form that creates a schedule at run time: a cron expression or an
// interval, and the JSON input of its runs.
function scheduleForm(act) {
  const form = el("form", { class: "action-form", id: "schedule-create", onsubmit: async (e) => {
    e.preventDefault();
    const data = new FormData(form);
    const text = (k) => String(data.get(k) || "").trim();
    const body = { workflow: text("workflow") };
    for (const k of ["cron", "every", "tz", "queue"]) if (text(k)) body[k] = text(k);
    if (text("input")) {
      try { body.input = JSON.parse(text("input")); } catch (err) { document.getElementById("schedule-message").textContent = `the input is not JSON: ${err.message}`; return; }
    }
    if (await act(text("name"), "create", body)) form.reset();
  } },
  el("label", {}, "name ", el("input", { name: "name", id: "schedule-name", required: true, size: "14" })),
  el("label", {}, "workflow ", el("input", { name: "workflow", id: "schedule-workflow", required: true, size: "14" })),
  el("label", {}, "cron ", el("input", { name: "cron", id: "schedule-cron", placeholder: "0 2 * * *", size: "12" })),
  el("label", {}, "or every ", el("input", { name: "every", id: "schedule-every", placeholder: "15m", size: "6" })),
  el("label", {}, "time zone ", el("input", { name: "tz", id: "schedule-tz", placeholder: "UTC", size: "12" })),
  el("label", {}, "input ", el("input", { name: "input", id: "schedule-input", placeholder: "JSON", size: "14" })),
  el("label", {}, "queue ", el("input", { name: "queue", id: "schedule-queue", size: "8" })),
  el("button", { type: "submit", id: "schedule-submit", text: "Create" }));
  return el("section", { id: "schedule-create-section" }, el("h2", { text: "New schedule" }), form);
}

// The form that changes a schedule made at run time: only the fields filled
// in change (a cron expression replaces an interval, and the other way round);
// the schedule keeps its state and last tick.
function scheduleEditForm(act, s, close) {
  const form = el("form", { class: "action-form", id: "schedule-edit", onsubmit: async (e) => {
    e.preventDefault();
    const data = new FormData(form);
    const text = (k) => String(data.get(k) || "").trim();
    const body = {};
    for (const k of ["cron", "every", "tz", "overlap", "catch_up", "queue"]) if (text(k)) body[k] = text(k);
    if (text("input")) {
      try { body.input = JSON.parse(text("input")); } catch (err) { document.getElementById("schedule-message").textContent = `the input is not JSON: ${err.message}`; return; }
    }
    if (await act(s.name, "update", body)) close();
  } },
  el("label", {}, "cron ", el("input", { name: "cron", id: "edit-cron", placeholder: "0 2 * * *", size: "12" })),
  el("label", {}, "or every ", el("input", { name: "every", id: "edit-every", placeholder: "15m", size: "6" })),
  el("label", {}, "time zone ", el("input", { name: "tz", id: "edit-tz", size: "12" })),
  el("label", {}, "input ", el("input", { name: "input", id: "edit-input", placeholder: "JSON", size: "14" })),
  el("label", {}, "overlap ", el("select", { name: "overlap", id: "edit-overlap" },
    ["", "skip", "buffer_one", "allow", "cancel_other"].map((o) => el("option", { value: o, text: o || "(as it is)" })))),
  el("label", {}, "catch up ", el("input", { name: "catch_up", id: "edit-catch-up", placeholder: "1h", size: "6" })),
  el("label", {}, "queue ", el("input", { name: "queue", id: "edit-queue", size: "8" })),
  el("button", { type: "submit", id: "schedule-update-submit", text: "Change" }),
  " ", el("button", { type: "button", id: "schedule-edit-close", onclick: close, text: "Close" }));
  return el("section", { id: "schedule-edit-section", "data-name": s.name },
    el("h2", { text: `Change schedule ${s.name}` }),
    el("p", { class: "muted small", text: `Now: ${s.spec}. Fields left empty stay as they are.` }), form);
}

// --- routing ---------------------------------------------------------------------------

let info = null;

async function route() {
  const main = document.getElementById("main");
  if (info === null) {
    try {
      info = await api("/api/info");
      document.getElementById("target").textContent = info.target;
    } catch (e) {
      showError(main, e.message);
      return;
    }
  }
  const path = location.pathname;
  poller.stop();
  for (const a of document.querySelectorAll(".top nav a")) a.classList.toggle("here", a.getAttribute("href") === path || (path.startsWith("/runs/") && a.getAttribute("href") === "/"));
  if (path === "/") await runsPage(main, info);
  else if (path === "/queues") { live.close(); await queuesPage(main); }
  else if (path === "/schedules") { live.close(); await schedulesPage(main, info); }
  else if (path.startsWith("/runs/")) await runPage(main, decodeURIComponent(path.slice("/runs/".length)));
  else showError(main, `no page ${path}`);
}

window.addEventListener("popstate", route);
window.addEventListener("DOMContentLoaded", route);
