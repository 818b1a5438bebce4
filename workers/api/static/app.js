// Ratchet's run pages, served by `ratchet api` at /ui/: the list of runs and one run as a
// timeline. Plain script, no build step, no dependency. Everything a run holds (model and tool
// output above all) is untrusted: it reaches the page through textContent only, never as HTML.
"use strict";

const TOKEN_KEY = "ratchet.token";
const FINAL = new Set(["COMPLETED", "ERROR", "CANCELLED", "PAUSED"]); // PAUSED: read again, not streamed
const STATUSES = ["QUEUED", "RUNNING", "WAITING", "PAUSED", "ERROR", "COMPLETED", "CANCELLED"];
const LIST_POLL_MS = 3000; // the list is read again this often while the tab is visible
const RUN_POLL_MS = 5000; // a live run is read again this often, besides its event stream
const PAGE = 50;
const CLIP = 4000; // characters of a message shown before "show all"
const API = new URL("..", location.href); // the API's root: the page is served at <root>/ui/

let view = null; // what is on the page now: {stop()} ends its polling and streams
const expanded = new Set(); // messages shown whole, by run id and index

// ------------------------------------------------------------------ helpers

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// A model as "provider / id", or its id alone when it names no provider (a scripted model).
function modelName(model) {
  return model.provider ? `${model.provider} / ${model.id}` : model.id;
}

function badge(status) {
  return el("span", { class: `badge s-${STATUSES.includes(status) ? status : "x"}`, text: status });
}

function runLink(id, text) {
  return el("a", { href: `#/runs/${encodeURIComponent(id)}`, class: "mono", text: text || short(id) });
}

function short(id) {
  return id.length > 14 ? `${id.slice(0, 8)}…${id.slice(-4)}` : id;
}

// Formatters made once: toLocaleString() builds one per call, a cost a thousand messages feel.
const DATE_TIME = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });
const TIME = new Intl.DateTimeFormat(undefined, { timeStyle: "medium" });
const NUMBER = new Intl.NumberFormat();

function when(seconds) {
  if (seconds === null || seconds === undefined) return "";
  return DATE_TIME.format(new Date(seconds * 1000));
}

function clock(seconds) {
  return TIME.format(seconds === undefined ? new Date() : new Date(seconds * 1000));
}

function ago(seconds) {
  const s = Math.max(0, Date.now() / 1000 - seconds);
  if (s < 60) return `${Math.floor(s)} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

function took(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(2)} s`;
  return `${(seconds / 60).toFixed(1)} min`;
}

function tokens(m) {
  if (!m) return "–";
  const n = (v) => (v === null || v === undefined ? "?" : NUMBER.format(v));
  return `${n(m.input_tokens)} in · ${n(m.output_tokens)} out`;
}

function flash(message) {
  const box = document.getElementById("flash");
  box.textContent = message || "";
  box.hidden = !message;
}

function setLive(text, on) {
  const live = document.getElementById("live");
  live.textContent = text;
  live.classList.toggle("on", Boolean(on));
}

// ------------------------------------------------------------------ the API

class ApiError extends Error {
  constructor(status, type, message) {
    super(message);
    this.status = status;
    this.type = type;
  }
}

function headers(extra) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return { Accept: "application/json", ...(token ? { Authorization: `Bearer ${token}` } : {}), ...extra };
}

async function api(path, options = {}) {
  // A POST or DELETE says it sends JSON, body or not: without tokens the API takes no other
  // (a form on another site cannot send it: workers/api/loopback.py).
  const writes = options.method === "POST" || options.method === "DELETE";
  const sent = writes ? { "Content-Type": "application/json", ...options.headers } : options.headers;
  const response = await fetch(new URL(path, API), { ...options, headers: headers(sent) });
  if (response.ok) return response.status === 204 ? null : response.json();
  let type = "HTTPError";
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error) ({ type, message } = body.error);
  } catch (_) { /* not JSON: keep the status line */ }
  if (response.status === 401) askForToken(message);
  throw new ApiError(response.status, type, message);
}

function askForToken(message) {
  const form = document.getElementById("token-form");
  form.hidden = false;
  document.getElementById("token-note").textContent = message || "This server needs a token.";
  document.getElementById("token-input").focus();
}

// ------------------------------------------------------------------ routing

function route() {
  if (view) view.stop();
  view = null;
  flash("");
  setLive("", false);
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  const match = path.match(/^\/runs\/([^/]+)$/);
  const [time, agent, session] = [/^\/runs\/([^/]+)\/time$/, /^\/agents\/([^/]+)$/, /^\/sessions\/([^/]+)$/].map((r) => path.match(r));
  if (path === "/schedules") view = schedulesView(); // schedules.js
  else if (path === "/agents") view = agentsView(); // agents.js
  else if (agent) view = agentView(decodeURIComponent(agent[1]));
  else if (path === "/sessions") view = sessionsView(params); // sessions.js
  else if (session) view = sessionView(decodeURIComponent(session[1]));
  else if (time) view = timeAxisView(decodeURIComponent(time[1])); // timeaxis.js
  else if (path === "/playground") view = playgroundView(params); // playground.js
  else view = match ? runView(decodeURIComponent(match[1])) : listView(params);
}

// ------------------------------------------------------------------ the list of runs

function listView(params) {
  const main = document.getElementById("main");
  document.body.dataset.view = "list";
  let shown = PAGE;
  let timer = null;
  let stopped = false;
  const body = el("tbody");
  const more = el("div", { class: "more" });
  const batch = batchBar(() => load()); // batches.js: the runs picked, continued or cancelled together
  const table = el("table", { class: "runs panel" },
    el("thead", {}, el("tr", {}, el("th", { class: "pick" }, batch.all),
      ["Status", "Run", "Agent", "Session", "User", "Steps", "Messages", "Created", "Updated", "Error"]
        .map((h) => el("th", { text: h })))),
    body);
  main.replaceChildren(el("h1", { text: "Runs" }), filterForm(params), batch.node, table, more);

  async function load() {
    clearTimeout(timer);
    const query = new URLSearchParams(params);
    query.set("limit", String(Math.min(shown, 1000)));
    try {
      const page = await api(`runs?${query}`);
      if (stopped) return;
      body.replaceChildren(...page.runs.map((run) => runRow(run, batch.cell(run))));
      batch.drawn(page.runs);
      if (!page.runs.length) body.append(el("tr", {}, el("td", { colspan: 11, class: "empty", text: "No runs match." })));
      more.replaceChildren(page.next_cursor && shown < 1000
        ? el("button", { class: "ghost", type: "button", text: "Show more", onclick: () => { shown += PAGE; load(); } })
        : "");
      document.body.dataset.state = "ready";
      if (!performance.getEntriesByName("ratchet:list-rendered").length) {
        requestAnimationFrame(() => setTimeout(() => performance.mark("ratchet:list-rendered")));
      }
      setLive(`Live · updated ${clock()}`, true);
      flash("");
    } catch (error) {
      if (stopped) return;
      setLive("Not updating", false);
      flash(error.message);
      if (error.status === 401) return; // until a token is given
    }
    timer = setTimeout(poll, LIST_POLL_MS);
  }

  function poll() {
    if (document.hidden) timer = setTimeout(poll, LIST_POLL_MS);
    else load();
  }

  load();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

function filterForm(params) {
  const field = (name, label, placeholder) =>
    el("label", {}, label, el("input", { name, value: params.get(name) || "", placeholder, size: 16 }));
  const status = el("select", { name: "status" }, el("option", { value: "", text: "any" }),
    STATUSES.map((s) => el("option", { value: s, text: s, selected: params.get("status") === s })));
  const form = el("form", { class: "filters panel" },
    el("label", {}, "Status", status),
    field("agent", "Agent", "agent or team"),
    field("session_id", "Session", "session id"),
    field("user_id", "User", "user id"),
    field("since", "Since", "6h, 7d or ISO 8601"),
    el("label", { class: "check" }, el("input", { type: "checkbox", name: "members", checked: params.get("members") === "true" }), "member runs too"),
    el("button", { type: "submit", text: "Filter" }),
    el("button", { type: "button", id: "waiting", class: params.get("status") === "PAUSED" ? "" : "ghost", text: "Waiting for you",
      title: "runs PAUSED until a person decides their calls", onclick: () => { location.hash = "#/?status=PAUSED"; } }),
    el("button", { type: "button", id: "failed", class: params.get("status") === "ERROR" ? "" : "ghost", text: "Failed",
      title: "runs in ERROR: pick them to continue or cancel them together", onclick: () => { location.hash = "#/?status=ERROR"; } }),
    el("button", { type: "button", class: "ghost", text: "Clear", onclick: () => { location.hash = "#/"; } }));
  const apply = (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const [key, value] of new FormData(form)) if (value) query.set(key, value === "on" ? "true" : value);
    location.hash = `#/?${query}`;
  };
  form.addEventListener("submit", apply);
  status.addEventListener("change", apply);
  return form;
}

function runRow(run, pick) {
  const open = () => { location.hash = `#/runs/${encodeURIComponent(run.run_id)}`; };
  return el("tr", { class: "run", "data-run": run.run_id, "data-status": run.status, onclick: open },
    pick,
    el("td", {}, badge(run.status)),
    el("td", {}, runLink(run.run_id)),
    el("td", { text: run.agent_name }),
    el("td", { class: "mono", text: short(run.session_id) , title: run.session_id }),
    el("td", { text: run.user_id || "" }),
    el("td", { class: "num", text: run.seq }),
    el("td", { class: "num", text: run.n_messages }),
    el("td", { title: when(run.created_at), text: ago(run.created_at) }),
    el("td", { title: when(run.updated_at), text: ago(run.updated_at) }),
    el("td", { class: "err", title: run.error ? run.error.message : "", text: run.error ? `${run.error.type}: ${run.error.message}` : "" }));
}

// ------------------------------------------------------------------ one run

function runView(runId) {
  const main = document.getElementById("main");
  document.body.dataset.view = "run";
  main.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  let stopped = false;
  let timer = null;
  let pending = null;
  let stream = null;
  let first = true;
  let shown = null; // what a paused run's page shows: redrawn only when it changes
  let failed = false; // the last read failed (and said so)
  let agent; // its agent as the catalog has it: undefined until read, null if it has none
  const live = el("div", { class: "live-text", hidden: true }, el("div", { class: "muted", text: "writing…" }), el("pre"));

  async function load() {
    clearTimeout(timer);
    try {
      const [run, steps, log] = await Promise.all([
        api(`runs/${encodeURIComponent(runId)}`),
        api(`runs/${encodeURIComponent(runId)}/steps`),
        api(`runs/${encodeURIComponent(runId)}/log`),
      ]);
      if (stopped) return;
      if (failed) { failed = false; flash(""); }
      if (!first && run.status === "PAUSED" && shape(run) === shown) { // nothing changed: keep what is typed
        timer = setTimeout(load, RUN_POLL_MS);
        return;
      }
      shown = shape(run);
      if (first) performance.mark("ratchet:run-data"); // the benchmark's: the API has answered
      const following = window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
      main.replaceChildren(renderRun(run, steps.steps, log.entries, { reload: () => load(), live, agent }));
      if (agent === undefined) readAgent(run);
      document.body.dataset.state = "ready";
      document.body.dataset.status = run.status;
      if (first) { // the first load's end: once the timeline is painted
        first = false;
        requestAnimationFrame(() => setTimeout(() => performance.mark("ratchet:run-rendered")));
      } else if (following && !FINAL.has(run.status)) window.scrollTo(0, document.body.scrollHeight);
      if (FINAL.has(run.status)) {
        setLive(`${run.status} · read ${clock()}`, false);
        live.hidden = true;
        // A paused run waits for decisions, made here or elsewhere: read it again, redrawn on a change.
        if (run.status === "PAUSED") timer = setTimeout(load, RUN_POLL_MS);
      } else {
        setLive("Live", true);
        follow(run);
        timer = setTimeout(load, RUN_POLL_MS);
      }
    } catch (error) {
      if (stopped) return;
      flash(error.message);
      failed = true;
      if (error.status === 404) main.replaceChildren(el("p", { class: "empty", text: `No run ${runId}.` }));
      else if (error.status !== 401) timer = setTimeout(load, RUN_POLL_MS); // the network, the server: again
    }
  }

  async function readAgent(run) { // once, after the first paint: the timeline does not wait for it
    agent = null;
    // 404: no worker has served it (null); any other failure is said as that, not as a missing agent.
    const found = await api(`agents/${encodeURIComponent(run.agent_name)}`).catch((e) => (e instanceof ApiError && e.status === 404 ? null : e));
    if (stopped) return;
    agent = found;
    const node = document.getElementById("definition");
    if (node) node.replaceWith(definitionNode(run, agent));
  }

  function shape(run) { // a paused run's status and what it asks, as drawn
    return JSON.stringify([run.status, run.seq, (run.requirements || []).map((r) => [r.id, r.status])]);
  }

  function soon() { // many events in a burst: read the run once
    if (!pending) pending = setTimeout(() => { pending = null; load(); }, 250);
  }

  function follow(run) {
    if (stream) return;
    const stored = run.messages.length - (run.messages.length && run.messages[0].role === "system" ? 1 : 0);
    stream = readEvents(runId, `${stored}-0-0-0`, (event) => {
      if (event.event === "RunContent") {
        live.hidden = false;
        live.lastChild.textContent += event.content || "";
      } else {
        if (event.event === "StepRestarted") live.lastChild.textContent = "";
        else { live.lastChild.textContent = ""; live.hidden = true; }
        soon();
      }
    }, () => { stream = null; if (!stopped) soon(); });
  }

  load();
  return {
    stop() {
      stopped = true;
      clearTimeout(timer);
      clearTimeout(pending);
      if (stream) stream.abort();
    },
  };
}

// The run's events as server-sent events, read with fetch so that the token goes in a header
// (EventSource cannot send one). Reconnects with Last-Event-ID until the server ends the stream.
function readEvents(runId, after, onEvent, onEnd) {
  const control = new AbortController();
  let last = after;
  (async () => {
    try {
      for (let tries = 0; tries < 30 && !control.signal.aborted; tries++) {
        const response = await fetch(new URL(`runs/${encodeURIComponent(runId)}/events`, API), {
          headers: headers({ Accept: "text/event-stream", "Last-Event-ID": last }), signal: control.signal,
        });
        if (response.status === 204 || !response.ok || !response.body) break;
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value.replace(/\r\n?/g, "\n");
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            const fields = {};
            for (const line of block.split("\n")) {
              if (!line || line.startsWith(":")) continue;
              const colon = line.indexOf(":");
              const name = colon < 0 ? line : line.slice(0, colon);
              fields[name] = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            }
            if (fields.data === undefined) continue;
            if (fields.id) last = fields.id;
            onEvent(JSON.parse(fields.data));
          }
        }
        await new Promise((resolve) => setTimeout(resolve, 500)); // the server ended it: ask again
      }
    } catch (_) { /* aborted, or the connection failed: the poll goes on */ }
    onEnd();
  })();
  return control;
}

function renderRun(run, steps, log, ctx) {
  const kind = run.member_runs.length ? "team" : "run";
  const m = run.metrics || {};
  const facts = [
    ["Agent", run.agent_name], ["Session", run.session_id], ["User", run.user_id || "–"],
    ["Created", when(run.created_at)], ["Updated", when(run.updated_at)], ["Steps", run.seq],
    ["Messages", run.messages.filter((m) => m.role !== "system").length], ["Tokens", tokens(m)], ["Cost", m.cost === null || m.cost === undefined ? "–" : m.cost.toFixed(6)],
  ];
  if (run.priority !== null && run.priority !== undefined) facts.push(["Priority", run.priority]);
  if (run.deadline_at !== null && run.deadline_at !== undefined) facts.push(["Deadline", when(run.deadline_at)]);
  const links = [];
  if (run.parent_run_id) links.push(el("div", {}, el("dt", { text: "Member of" }), el("dd", {}, runLink(run.parent_run_id))));
  if (run.forked_from) links.push(el("div", {}, el("dt", { text: "Forked from" }), el("dd", {}, runLink(run.forked_from))));
  const out = document.createDocumentFragment();
  out.append(
    el("div", { class: "crumbs" }, el("a", { href: "#/", text: "Runs" }), " / ", kind, " · ",
      el("a", { href: `#/runs/${encodeURIComponent(run.run_id)}/time`, id: "time-link", text: "time axis" }), " · ",
      el("a", { href: `#/sessions/${encodeURIComponent(run.session_id)}`, id: "session-link", text: "its session" })),
    el("h1", {}, badge(run.status), el("span", { text: run.agent_name }), el("code", { class: "muted", text: run.run_id })),
    el("dl", { class: "facts panel" },
      facts.map(([k, v]) => el("div", {}, el("dt", { text: k }), el("dd", { text: v, title: v }))), links),
    actions(run, ctx));
  if (run.error) {
    out.append(el("div", { class: "errorbox", id: "run-error" },
      el("b", { text: `${run.error.type}` }), el("pre", { text: run.error.message })));
  }
  const asked = requirementsPanel(run, ctx);
  if (asked) out.append(asked);
  if (run.retry) {
    out.append(el("div", { class: "note", text: `Waiting to retry (retry ${run.retry.attempt}) at ${when(run.retry.until)} after ${run.retry.reason}` }));
  }
  if (run.member_runs.length) out.append(el("h2", { text: "Member runs" }), el("div", { class: "panel" }, memberTree(run.member_runs, true)));
  out.append(el("h2", { text: "Definition" }), definitionNode(run, ctx.agent));
  out.append(el("h2", { text: "Timeline" }), timeline(run, steps, log), ctx.live);
  return out;
}

// The agent's definition as the catalog holds it: the one the run is on when the
// catalog has it, else the latest, with whether a live worker serves it.
function definitionNode(run, agent) {
  if (agent === undefined) return el("p", { class: "muted panel", id: "definition", text: "Reading the catalog…" });
  if (!agent) return el("p", { class: "muted panel", id: "definition", text: "No worker has served this agent into the catalog." });
  if (agent instanceof Error) return el("p", { class: "muted panel", id: "definition", text: `Could not read the catalog: ${agent.message}` });
  const d = agent.definitions.find((v) => v.definition_hash === run.definition_hash) || agent.latest;
  const served = d.live ? "live" : `not live · last seen ${when(d.last_seen)} (${ago(d.last_seen)})`;
  const facts = [
    ["Model", modelName(d.model)], ["Kind", d.kind], ["Served", served],
    ["Hash", d.definition_hash.slice(0, 12)], ["Queues", `steps ${d.queue || "default"} · tools ${d.tool_queue || "default"}`],
  ];
  if (d.members.length) facts.push(["Members", d.members.join(", ")]);
  facts.push(["Output", d.output_schema ? "JSON schema" : "text"]);
  const node = el("div", { class: "panel", id: "definition", "data-live": d.live ? "true" : "false" },
    el("dl", { class: "facts" }, facts.map(([k, v]) => el("div", {}, el("dt", { text: k }), el("dd", { text: v, title: k === "Hash" ? d.definition_hash : v })))));
  if (run.definition_hash && run.definition_hash !== d.definition_hash) {
    node.append(el("p", { class: "note", text: `This run is on definition ${run.definition_hash.slice(0, 12)}, which the catalog does not hold; the latest is shown.` }));
  }
  const tools = d.tools.map((t) => {
    const flags = Object.entries(t.flags).map(([k, v]) => (v === true ? k : `${k}=${v}`)).join(", ");
    return el("li", {}, el("code", { text: t.name }), flags ? el("span", { class: "muted", text: ` [${flags}]` }) : null, ` ${t.description}`);
  });
  node.append(tools.length ? el("ul", { class: "tools" }, tools) : el("p", { class: "muted", text: "No tools." }));
  return node;
}

function actions(run, ctx) {
  const box = el("div", { class: "actions" });
  const input = el("input", { placeholder: run.status === "COMPLETED" ? "a new message (forks the run)" : "a new message (optional)" });
  const canContinue = ["ERROR", "COMPLETED", "RUNNING"].includes(run.status); // PAUSED: its decisions resume it
  const go = el("button", { type: "button", id: "continue", disabled: !canContinue, text: run.status === "COMPLETED" ? "Continue as a fork" : "Continue" });
  go.addEventListener("click", async () => {
    go.disabled = true;
    const body = input.value ? { input: input.value } : {};
    try {
      const next = await api(`runs/${encodeURIComponent(run.run_id)}/continue`, {
        method: "POST", body: JSON.stringify(body),
      });
      if (next.run_id !== run.run_id) location.hash = `#/runs/${encodeURIComponent(next.run_id)}`;
      else ctx.reload();
    } catch (error) {
      flash(`Continue: ${error.message}`);
      go.disabled = false;
    }
  });
  const cancellable = ["QUEUED", "RUNNING", "WAITING", "PAUSED", "ERROR"].includes(run.status);
  const stop = el("button", { type: "button", id: "cancel", class: "danger", disabled: !cancellable, text: "Cancel run" });
  let armed = null;
  stop.addEventListener("click", async () => {
    if (!armed) { // a second click within 4 s cancels: one slip of the mouse does not
      stop.classList.add("armed");
      stop.textContent = "Click again to cancel";
      armed = setTimeout(() => { armed = null; stop.classList.remove("armed"); stop.textContent = "Cancel run"; }, 4000);
      return;
    }
    clearTimeout(armed);
    stop.disabled = true;
    try {
      await api(`runs/${encodeURIComponent(run.run_id)}/cancel`, { method: "POST" });
      ctx.reload();
    } catch (error) {
      flash(`Cancel: ${error.message}`);
    }
  });
  box.append(input, go, stop);
  const accept = run.status === "ERROR" ? accepting(run.error) : null;
  if (accept) { // a deploy stopped the run (or its member): go on under the definition its error names
    const shown = typeof accept === "string" ? accept : Object.values(accept)[0];
    // A member's error names a mapping for its team: the team is what is continued
    const target = typeof accept === "string" || !run.parent_run_id ? run.run_id : run.parent_run_id;
    const under = el("button", { type: "button", id: "accept-definition", text: `Continue under definition ${shown.slice(0, 12)}` });
    under.addEventListener("click", async () => {
      under.disabled = true;
      try {
        await api(`runs/${encodeURIComponent(target)}/continue`, { method: "POST", body: JSON.stringify({ accept_definition: accept }) });
        ctx.reload();
      } catch (error) {
        flash(`Continue: ${error.message}`);
        under.disabled = false;
      }
    });
    box.append(under, el("div", { class: "note", id: "definition-note", text: "A deploy changed what this run's next step depends on (its error says what). Check that the new definition may answer it, then continue under it." }));
  }
  if (run.status === "PAUSED") {
    box.append(el("div", { class: "note", id: "paused-note", text: "This run is PAUSED: it waits for a person and holds no worker. Decide each call below; the last decision resumes it." }));
  }
  return box;
}

// What a DefinitionChangedError (the run's, or its member's in a MemberRunError) says to accept:
// its own definition's hash, or {member name: hash} for its team (docs/deploys.md).
function accepting(error) {
  const text = error ? error.message : "";
  const own = text.match(/accept_definition='([0-9a-f]{64})'/);
  if (own) return own[1];
  const member = text.match(/accept_definition=\{'([^']+)': '([0-9a-f]{64})'\}/);
  return member ? { [member[1]]: member[2] } : null;
}

function memberTree(members, root) {
  return el("ul", { class: root ? "tree root" : "tree" }, members.map((member) => el("li", {},
    badge(member.status), " ", el("span", { text: member.agent_name }), " ", runLink(member.run_id),
    el("span", { class: "meta", text: [tokens(member.metrics), member.error ? `${member.error.type}: ${member.error.message}` : ""].filter(Boolean).join(" · ") }),
    member.member_runs.length ? memberTree(member.member_runs, false) : null)));
}

// The timeline: each stored message at its index, each step before the first message it wrote
// (or where it would have), each log entry after the messages written before it. Steps and log
// entries at one place go by step (seq): an entry logged as it moved the run on to step s (a
// retry, a delegation, a fan-in, a continue in place, a pause) before step s, one that happened in step s
// (an error, a lease taken back, a fenced write, a cancel, a team's continue) after it.
function timeline(run, steps, log) {
  const box = el("div", { class: "timeline", id: "timeline" });
  let messages = run.messages;
  if (messages.length && messages[0].role === "system") {
    box.append(el("details", { class: "system" }, el("summary", { text: "System message" }), el("pre", { text: messages[0].content || "" })));
    messages = messages.slice(1);
  }
  const at = new Map(); // position -> [[seq, rank, order, node]]
  const put = (position, key, node) => {
    if (!at.has(position)) at.set(position, []);
    at.get(position).push([...key, node]);
  };
  steps.forEach((step, i) => put(step.position, [step.seq, 1, i], stepNode(step, run.definition_hash)));
  log.forEach((entry, i) => {
    const d = entry.detail || {};
    if ((entry.kind === "error" && !d.member_run_id) || entry.kind === "retry" || entry.kind === "fallback") return; // on their step
    if (entry.kind === "decision" || (entry.kind === "resume" && d.to !== "WAITING")) return; // on the decision step
    const opens = ["delegate", "fan_in", "paused"].includes(entry.kind) || (entry.kind === "continue" && d.to !== "WAITING");
    put(d.n_messages ?? messages.length, [entry.seq ?? 0, opens ? 0 : 2, i], logNode(entry));
  });
  const frag = document.createDocumentFragment();
  const flush = (position) => {
    const items = at.get(position);
    if (!items) return;
    items.sort((a, b) => a[0] - b[0] || a[1] - b[1] || a[2] - b[2]);
    for (const item of items) frag.append(item[3]);
    at.delete(position);
  };
  messages.forEach((message, i) => {
    flush(i);
    frag.append(messageNode(run.run_id, message, i));
  });
  for (const position of [...at.keys()].sort((a, b) => a - b)) flush(position);
  box.append(frag);
  return box;
}

// `runs_on`: the run's definition now; a step its worker ran on another is marked (a deploy).
function stepNode(step, runs_on) {
  const other = step.definition_hash && step.definition_hash !== runs_on;
  const what = { model: "model call", tools: "tool batch", fan_in: "fan-in", decision: "waiting for a person" }[step.task] || step.task;
  const took_ = step.duration !== null ? took(step.duration) : step.ready_at ? `${took(Date.now() / 1000 - step.ready_at)} so far` : "–";
  const worker = step.worker ? `${step.worker} · task ${step.task_id || "?"}` : "–";
  return el("div", { class: `step ${step.status}`, "data-seq": step.seq, "data-status": step.status },
    el("span", { class: "title", text: `Step ${step.seq} · ${what}` }),
    el("span", { text: step.status }),
    el("span", { text: `attempt ${step.attempt}` }),
    el("span", { title: "from its claim to its last write (where the claim was not stamped: from when it could start, queue time included)", text: took_ }),
    step.metrics ? el("span", { text: tokens(step.metrics) }) : null,
    step.model ? el("span", { class: "model", text: `model ${step.model}` }) : null,
    step.definition_hash ? el("span", { class: `definition${other ? " flag" : ""}`, title: other ? `the run is on ${runs_on ? runs_on.slice(0, 12) : "no recorded definition"} now` : step.definition_hash,
      text: `definition ${step.definition_hash.slice(0, 12)}${other ? " (not the run's now)" : ""}` }) : null,
    (step.fallbacks || []).map((f) => el("div", { class: "fallback", text: `fell back: ${f.failed_model} → ${f.model} after ${f.error.type}: ${f.error.message}` })),
    step.tool_errors ? el("span", { class: "flag", text: `${step.tool_errors} tool error${step.tool_errors > 1 ? "s" : ""}` }) : null,
    el("span", { class: "muted", title: "a step's worker is known while it holds its lease; a commit clears it", text: `worker ${worker}` }),
    step.error ? el("div", { class: "error", text: `${step.error.type}: ${step.error.message}` }) : null,
    step.task === "decision" ? el("span", { text: `asked ${step.asked} · decided ${step.decisions.length}` }) : null,
    step.task === "decision" && step.decisions.length ? el("ul", { class: "decisions" }, step.decisions.map((d) =>
      el("li", { "data-requirement": d.requirement, text: `${d.decision} by ${d.by || "an unnamed decider"} · ${clock(d.at)}` }))) : null);
}

function messageNode(runId, message, index) {
  const failed = message.role === "tool" && message.tool_call_error;
  const node = el("article", { class: `msg ${message.role}${failed ? " tool-error" : ""}`, "data-index": index });
  const head = el("header", {}, el("span", { class: "role", text: message.role }));
  if (message.role === "tool") head.append(el("span", { class: "mono", text: message.tool_name || "" }));
  if (failed) head.append(el("span", { class: "flag", text: "tool error" }));
  if (message.metrics) head.append(el("span", { text: tokens(message.metrics) }));
  if (message.created_at) head.append(el("span", { title: when(message.created_at), text: clock(message.created_at) }));
  node.append(head);
  if (message.content) node.append(clipped(`${runId}:${index}`, message.content));
  if (message.role === "tool" && message.tool_args) {
    node.append(el("div", { class: "muted mono", text: `args ${JSON.stringify(message.tool_args)}`.slice(0, 600) }));
  }
  if (message.tool_calls && message.tool_calls.length) {
    node.append(el("ul", { class: "calls" }, message.tool_calls.map((call) => {
      const fn = call.function || {};
      return el("li", { text: `${fn.name || "?"}(${String(fn.arguments || "").slice(0, 600)})` });
    })));
  }
  return node;
}

function clipped(key, text) {
  const pre = el("pre");
  if (text.length <= CLIP || expanded.has(key)) {
    pre.textContent = text;
    return pre;
  }
  pre.textContent = `${text.slice(0, CLIP)}…`;
  const more = el("button", { type: "button", class: "ghost", text: `show all ${NUMBER.format(text.length)} characters` });
  more.addEventListener("click", () => { expanded.add(key); pre.textContent = text; more.remove(); });
  return el("div", {}, pre, more);
}

function logNode(entry) {
  const d = entry.detail || {};
  const words = {
    lease_expired: "the sweeper took the step back from a worker that stopped",
    fenced: d.cause === "cancel" ? "the run was cancelled while this step ran: its write was refused"
      : `a stale write was refused${d.owner ? ` (from ${d.owner})` : ""}`,
    completed: "the final answer was committed",
    continue: "continued", cancel: "cancelled", delegate: "delegated to member runs",
    fan_in: "the members ended: their answers were fanned in",
    definition: `goes on under definition ${String(d.to || "").slice(0, 12)}, was ${d.from ? String(d.from).slice(0, 12) : "none"} (${d.why === "accepted" ? "accepted by a continue" : d.why === "unchanged" ? "nothing its next step depends on changed" : "no worker ran the other"})`,
    handed_on: `handed on to a worker of definition ${String(d.to || "").slice(0, 12)}`,
    error: `${d.type || "Error"}: ${d.message || ""}`,
    paused: d.requirements ? `paused: waiting for ${d.requirements.length} decision${d.requirements.length === 1 ? "" : "s"}` : "paused with its member",
    decision: `${d.decision || "decided"}${d.by ? ` by ${d.by}` : ""} (requirement ${short(String(d.requirement || ""))})`,
    resume: d.to === "WAITING" ? "its members' calls are decided: the team waits for them again" : "every call is decided: the run is queued again",
  };
  const node = el("div", { class: `logline${entry.kind === "error" ? " bad" : ""}`, "data-kind": entry.kind },
    el("b", { text: entry.kind }), " · ", words[entry.kind] || JSON.stringify(d), " · ",
    el("span", { title: when(entry.at), text: clock(entry.at) }));
  if (entry.kind === "delegate" && d.members) {
    for (const id of Object.keys(d.members)) node.append(" ", runLink(id, `${d.members[id]}`));
  }
  return node;
}

// ------------------------------------------------------------------ start

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = document.getElementById("token-input").value.trim();
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("token-input").value = "";
  event.target.hidden = true;
  route();
});
document.getElementById("token-button").addEventListener("click", () => askForToken(
  sessionStorage.getItem(TOKEN_KEY) ? "A token is set for this tab; enter another, or leave it empty to forget it." : ""));
window.addEventListener("hashchange", route);
route();
