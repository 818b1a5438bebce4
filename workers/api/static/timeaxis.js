// A run's time axis (#/runs/RUN_ID/time): each step as a row of a waterfall, on one clock from
// the run's creation, as Temporal's and LangSmith's timelines draw a workflow: the step's wait in
// the queue (from when it could start to its claim), its model call or tool batch (from its claim
// to its last write), each tool call of a batch under it (from the batch's claim to the commit of
// its result: the calls of a batch run at once), a wait for a person, and the team's member runs.
// Read from GET runs/{id} and runs/{id}/steps (`orchestrator.timeline`), read again while the run
// goes on. Drawn in SVG made here (no library); every name and text is set as text. Loaded
// before app.js, whose helpers it calls once the page routes here.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const AXIS_TICKS = [0, 0.25, 0.5, 0.75, 1];
const KIND_NAMES = {
  queue: "in the queue", model: "model call", tools: "tool batch", tool: "tool call", "tool-error": "tool call (error)",
  person: "waiting for a person", fan_in: "fan-in (waiting for members)", unstamped: "queue and work (claim not stamped)",
  running: "in progress", member: "member run",
};

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  node.append(...children);
  return node;
}

function timeAxisView(runId) {
  const main = document.getElementById("main");
  document.body.dataset.view = "time";
  main.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  let stopped = false;
  let timer = null;

  async function load() {
    clearTimeout(timer);
    try {
      const id = encodeURIComponent(runId);
      const [run, steps] = await Promise.all([api(`runs/${id}`), api(`runs/${id}/steps`)]);
      if (stopped) return;
      flash("");
      main.replaceChildren(renderTimeAxis(run, steps.steps, Date.now() / 1000));
      document.body.dataset.state = "ready";
      document.body.dataset.status = run.status;
      const going = !FINAL.has(run.status) || run.status === "PAUSED";
      setLive(going ? "Live" : `${run.status} · read ${clock()}`, going);
      if (going) timer = setTimeout(load, RUN_POLL_MS);
    } catch (error) {
      if (stopped) return;
      flash(error.message);
      if (error.status === 404) main.replaceChildren(el("p", { class: "empty", text: `No run ${runId}.` }));
      else if (error.status !== 401) timer = setTimeout(load, RUN_POLL_MS);
    }
  }

  load();
  return { stop() { stopped = true; clearTimeout(timer); } };
}

// The rows of the waterfall, as times: [{kind, label, detail, spans: [{kind, from, to}], link}].
function axisRows(run, steps, now) {
  const transcript = withoutSystem(run.messages); // sessions.js
  const rows = [];
  for (const step of steps) {
    const ready = step.ready_at ?? run.created_at;
    const end = step.ended_at ?? now;
    const spans = [];
    if (step.task === "decision") spans.push({ kind: "person", from: ready, to: end });
    else if (step.task === "fan_in") spans.push({ kind: "fan_in", from: ready, to: end });
    else if (step.status === "queued") spans.push({ kind: "queue", from: ready, to: end });
    else if (step.started_at !== null && step.started_at !== undefined) {
      spans.push({ kind: "queue", from: ready, to: step.started_at });
      spans.push({ kind: step.ended_at === null ? "running" : step.task, from: step.started_at, to: end });
    } else spans.push({ kind: step.ended_at === null ? "running" : "unstamped", from: ready, to: end });
    rows.push({ kind: "step", step, spans });
    if (step.task !== "tools") continue;
    const from = step.started_at ?? ready;
    for (const message of transcript.slice(step.position, step.position + step.messages)) {
      if (message.role !== "tool") continue;
      const kind = message.tool_call_error ? "tool-error" : "tool";
      rows.push({ kind: "tool", message, spans: [{ kind, from, to: message.created_at ?? end }] });
    }
  }
  for (const member of run.member_runs) {
    const end = FINAL.has(member.status) && member.status !== "PAUSED" ? member.updated_at : now;
    rows.push({ kind: "member", member, spans: [{ kind: "member", from: member.created_at, to: end }] });
  }
  return rows;
}

function renderTimeAxis(run, steps, now) {
  const rows = axisRows(run, steps, now);
  const t0 = run.created_at;
  const t1 = Math.max(t0, ...rows.flatMap((r) => r.spans.map((s) => s.to)), FINAL.has(run.status) ? run.updated_at : now);
  const span = Math.max(t1 - t0, 1e-6);
  const totals = {};
  for (const row of rows) {
    if (row.kind !== "step") continue;
    for (const s of row.spans) totals[s.kind] = (totals[s.kind] || 0) + Math.max(s.to - s.from, 0);
  }
  const facts = [["Wall time", took(t1 - t0)], ["Steps", steps.length]];
  for (const kind of ["queue", "model", "tools", "person", "fan_in", "unstamped", "running"]) {
    if (totals[kind] !== undefined) facts.push([KIND_NAMES[kind], took(totals[kind])]);
  }
  const box = el("div", { class: "axis panel", id: "time-axis" }, axisHead(span),
    rows.map((row) => axisRow(row, t0, span)));
  if (!rows.length) box.append(el("p", { class: "empty", text: "No step has run yet." }));
  const out = document.createDocumentFragment();
  out.append(
    el("div", { class: "crumbs" }, el("a", { href: "#/", text: "Runs" }), " / ",
      runLink(run.run_id), " / time axis"),
    el("h1", {}, badge(run.status), el("span", { text: run.agent_name }), el("code", { class: "muted", text: run.run_id })),
    el("dl", { class: "facts panel", id: "axis-totals" },
      facts.map(([k, v]) => el("div", { "data-total": k }, el("dt", { text: k }), el("dd", { text: v })))),
    legend(rows), box,
    el("p", { class: "muted", text: "One clock from the run's creation. A step's wait in the queue runs from when it could start (the step before it ended, a continue, a retry's due time) to its claim; its call from the claim to its last write. A tool call runs from its batch's claim to the commit of its result: a batch's calls run at once, and each result is committed as it finishes. Where a claim was not stamped (a step that failed before writing, rows older than migration 0010) the bar runs from when the step could start, queue time included." }));
  return out;
}

function legend(rows) { // the kinds of bar drawn, in this order
  const drawn = new Set(rows.flatMap((r) => r.spans.map((s) => s.kind)));
  const kinds = ["queue", "model", "tools", "tool", "tool-error", "person", "fan_in", "member", "unstamped", "running"].filter((k) => drawn.has(k));
  return el("div", { class: "axis-legend" }, kinds.map((kind) => el("span", {},
    svg("svg", { class: "swatch", width: 12, height: 12 }, svg("rect", { class: `bar ${kind}`, width: 12, height: 12, rx: 2 })),
    ` ${KIND_NAMES[kind]}`)));
}

function axisHead(span) {
  const ticks = AXIS_TICKS.map((f) => {
    const anchor = f === 0 ? "start" : f === 1 ? "end" : "middle";
    const text = svg("text", { x: `${f * 100}%`, y: 13, "text-anchor": anchor });
    text.textContent = f === 0 ? "0" : took(span * f);
    return text;
  });
  return el("div", { class: "axis-row head" }, el("span", { class: "label", text: "Step" }),
    svg("svg", { class: "track ticks" }, ...ticks), el("span", { class: "took", text: "Took" }));
}

function axisRow(row, t0, span) {
  const pct = (t) => Math.min(Math.max(((t - t0) / span) * 100, 0), 100);
  const track = svg("svg", { class: "track" },
    ...[0.25, 0.5, 0.75].map((f) => svg("line", { class: "grid", x1: `${f * 100}%`, x2: `${f * 100}%`, y1: 0, y2: "100%" })));
  for (const s of row.spans) {
    const x = pct(s.from);
    const ms = Math.max(s.to - s.from, 0) * 1000;
    const rect = svg("rect", { class: `bar ${s.kind}`, x: `${x}%`, width: `${Math.max(pct(s.to) - x, 0.2)}%`, y: 3, height: 12, rx: 2, "data-kind": s.kind, "data-ms": ms });
    rect.append(svg("title", {}, `${KIND_NAMES[s.kind]}: ${took(ms / 1000)} (from +${took(s.from - t0)})`));
    track.append(rect);
  }
  const total = row.spans.reduce((sum, s) => sum + Math.max(s.to - s.from, 0), 0);
  const work = row.spans.filter((s) => s.kind !== "queue").reduce((sum, s) => sum + Math.max(s.to - s.from, 0), 0);
  const [label, attrs] = rowLabel(row);
  return el("div", { class: `axis-row k-${row.kind}`, ...attrs }, label, track,
    el("span", { class: "took", title: `${took(total)} with its wait in the queue`, text: took(row.kind === "step" ? work : total) }));
}

function rowLabel(row) {
  if (row.kind === "tool") {
    const m = row.message;
    return [el("span", { class: "label" }, el("span", { class: "mono", text: `↳ ${m.tool_name || "?"}` }),
      m.tool_call_error ? el("span", { class: "flag", text: "error" }) : null),
    { "data-tool": m.tool_name || "", "data-error": m.tool_call_error ? "true" : "false" }];
  }
  if (row.kind === "member") {
    const r = row.member;
    return [el("span", { class: "label" }, badge(r.status), " ", el("a", { href: `#/runs/${encodeURIComponent(r.run_id)}/time`, text: r.agent_name })),
      { "data-member": r.run_id }];
  }
  const step = row.step;
  const what = { model: "model call", tools: "tool batch", fan_in: "fan-in", decision: "waiting for a person" }[step.task] || step.task;
  const more = [step.model, step.metrics ? tokens(step.metrics) : null, step.attempt > 1 ? `attempt ${step.attempt}` : null].filter(Boolean).join(" · ");
  return [el("span", { class: "label", title: step.error ? `${step.error.type}: ${step.error.message}` : more },
    el("b", { text: `Step ${step.seq} · ${what}` }),
    step.status !== "done" ? el("span", { class: `state ${step.status}`, text: step.status }) : null,
    more ? el("span", { class: "muted", text: more }) : null),
  { "data-seq": step.seq, "data-task": step.task, "data-status": step.status }];
}
