// The sessions pages of the run pages. #/sessions: the sessions of the latest runs the token may
// read, newest first, gathered from GET /runs (a user's token lists that user's runs alone, so a
// user sees only their own sessions); #/sessions/ID: one session (GET /sessions/{id}, which a
// user's token reads only if it is theirs): its user, its state, its tokens, and its runs as one
// conversation, oldest first, each run's own messages (a fork's copy of its source left out).
// Messages are the model's and the tools' output: written as text, through app.js's messageNode.
// Loaded before app.js, whose helpers it calls once the page routes here.
"use strict";

const SESSION_RUNS = 200; // runs read per page of the sessions list

function sessionsView(params) {
  const main = document.getElementById("main");
  document.body.dataset.view = "sessions";
  let stopped = false;
  let cursor = null;
  const groups = new Map(); // session id -> {runs: [summary], ...}, in order of their newest run
  const body = el("tbody");
  const more = el("div", { class: "more" });
  const user = el("input", { name: "user_id", value: params.get("user_id") || "", placeholder: "user id", size: 16 });
  const form = el("form", { class: "filters panel" }, el("label", {}, "User", user), el("button", { type: "submit", text: "Filter" }));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = user.value ? `#/sessions?user_id=${encodeURIComponent(user.value)}` : "#/sessions";
  });
  const table = el("table", { class: "runs panel", id: "sessions" },
    el("thead", {}, el("tr", {}, ["Session", "User", "Runs", "Agents", "Latest", "Last activity", "Started"].map((h) => el("th", { text: h })))),
    body);
  main.replaceChildren(el("h1", { text: "Sessions" }), form,
    el("p", { class: "muted", text: "The sessions of the latest runs this token may read, newest first." }), table, more);

  async function load() {
    const query = new URLSearchParams({ limit: String(SESSION_RUNS) });
    if (params.get("user_id")) query.set("user_id", params.get("user_id"));
    if (cursor) query.set("cursor", cursor);
    try {
      const page = await api(`runs?${query}`);
      if (stopped) return;
      for (const run of page.runs) {
        if (!groups.has(run.session_id)) groups.set(run.session_id, []);
        groups.get(run.session_id).push(run);
      }
      cursor = page.next_cursor;
      body.replaceChildren(...[...groups].map(([id, runs]) => sessionRow(id, runs)));
      if (!groups.size) body.append(el("tr", {}, el("td", { colspan: 7, class: "empty", text: "No sessions yet: a run starts one." })));
      more.replaceChildren(cursor ? el("button", { class: "ghost", type: "button", text: "Older runs' sessions", onclick: load }) : "");
      document.body.dataset.state = "ready";
    } catch (error) {
      if (!stopped) flash(error.message);
    }
  }

  load();
  return { stop() { stopped = true; } };
}

function sessionRow(sessionId, runs) { // runs: newest first, as listed
  const open = () => { location.hash = `#/sessions/${encodeURIComponent(sessionId)}`; };
  const agents = [...new Set(runs.map((r) => r.agent_name))].join(", ");
  const last = Math.max(...runs.map((r) => r.updated_at));
  const first = Math.min(...runs.map((r) => r.created_at));
  return el("tr", { class: "run", "data-session": sessionId, onclick: open },
    el("td", {}, el("a", { href: `#/sessions/${encodeURIComponent(sessionId)}`, class: "mono", text: sessionId })),
    el("td", { text: runs[0].user_id || "" }),
    el("td", { class: "num", text: runs.length }),
    el("td", { text: agents }),
    el("td", {}, badge(runs[0].status)),
    el("td", { title: when(last), text: ago(last) }),
    el("td", { title: when(first), text: ago(first) }));
}

function sessionView(sessionId) {
  const main = document.getElementById("main");
  document.body.dataset.view = "session";
  main.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  let stopped = false;

  (async () => {
    try {
      const session = await api(`sessions/${encodeURIComponent(sessionId)}`);
      if (stopped) return;
      main.replaceChildren(renderSession(session));
      document.body.dataset.state = "ready";
    } catch (error) {
      if (stopped) return;
      flash(error.message);
      if (error.status === 404) main.replaceChildren(el("p", { class: "empty", id: "no-session", text: `No session ${sessionId}.` }));
    }
  })();
  return { stop() { stopped = true; } };
}

function renderSession(session) {
  const runs = session.runs;
  const byId = new Map(runs.map((r) => [r.run_id, r]));
  const last = runs[runs.length - 1];
  const m = session.metrics || {};
  const facts = [
    ["User", session.user_id || "–"], ["Runs", runs.length], ["Tokens", tokens(m)],
    ["Cost", m.cost === null || m.cost === undefined ? "–" : m.cost.toFixed(6)],
    ["Started", runs.length ? when(runs[0].created_at) : "–"], ["Last activity", last ? when(last.updated_at) : "–"],
  ];
  const out = document.createDocumentFragment();
  out.append(
    el("div", { class: "crumbs" }, el("a", { href: "#/sessions", text: "Sessions" }), " / session"),
    el("h1", {}, el("span", { text: "Session" }), el("code", { class: "muted", text: session.session_id })),
    el("dl", { class: "facts panel", id: "session-facts" },
      facts.map(([k, v]) => el("div", {}, el("dt", { text: k }), el("dd", { text: v, title: v })))),
    el("div", { class: "actions" }, last
      ? el("a", { class: "button", id: "go-on", href: `#/playground?run=${encodeURIComponent(last.run_id)}`, text: "Go on in the playground" })
      : null));
  if (Object.keys(session.session_state || {}).length) {
    out.append(el("h2", { text: "Session state" }), el("pre", { class: "panel state", id: "session-state", text: JSON.stringify(session.session_state, null, 2) }));
  }
  out.append(el("h2", { text: "Conversation" }),
    el("div", { class: "conversation", id: "conversation" }, runs.map((run) => sessionRun(run, byId.get(run.forked_from)))));
  return out;
}

// One run of a session: its head, then the messages it added (a fork starts with a copy of its source's).
function sessionRun(run, source) {
  const own = withoutSystem(run.messages);
  const skipped = source ? Math.min(withoutSystem(source.messages).length, own.length) : 0;
  const messages = own.slice(skipped);
  const id = encodeURIComponent(run.run_id);
  return el("section", { class: "session-run", "data-run": run.run_id, "data-status": run.status },
    el("header", {}, badge(run.status), el("span", { text: run.agent_name }), runLink(run.run_id),
      el("span", { class: "muted", title: when(run.created_at), text: ago(run.created_at) }),
      run.forked_from ? el("span", { class: "muted" }, "continues ", runLink(run.forked_from)) : null,
      el("a", { href: `#/runs/${id}/time`, text: "time axis" })),
    skipped ? el("p", { class: "muted", text: `${skipped} messages copied from the run it continues` }) : null,
    messages.map((message, i) => messageNode(run.run_id, message, skipped + i)),
    run.error ? el("div", { class: "errorbox" }, el("b", { text: run.error.type }), el("pre", { text: run.error.message })) : null);
}

// A transcript without its system message (the playground and the time axis count on it too).
function withoutSystem(messages) {
  return messages.length && messages[0].role === "system" ? messages.slice(1) : messages;
}
