// A person in the loop, on the run pages: a paused run's pending calls, each with its tool, its
// arguments and what it asks, decided from here (POST runs/{id}/requirements/{requirement_id},
// as `ratchet approve|reject|answer` and Client.decide do), and the decisions made so far.
// Loaded before app.js, whose helpers (el, api, when, ago) it calls once the page runs. A tool's
// arguments are the model's, untrusted: they reach the page as text only.
"use strict";

const DECIDER_KEY = "ratchet.decider"; // who decides, as typed once in this browser
const outcomes = new Map(); // requirement id -> what deciding it here answered: {ok, text, type}

const KIND_WORDS = { confirm: "approved", reject: "rejected", input: "answered", result: "result given", budget: "budget raised" };

// The section of a run's page on what it asked of a person: null if it asked nothing.
function requirementsPanel(run, ctx) {
  const asked = run.requirements || [];
  if (!asked.length) return null;
  const box = el("section", { id: "requirements" });
  const open = asked.filter((r) => r.status === "pending");
  if (open.length && run.status === "PAUSED") {
    box.append(el("h2", { text: `Waiting for you · ${open.length} call${open.length > 1 ? "s" : ""}` }),
      el("p", { class: "muted", text: "Each call below waits for a decision; the last one resumes the run under the same run id." }),
      deciderField(),
      ...open.map((r) => pendingNode(run, r, ctx)));
  }
  const done = asked.filter((r) => r.status !== "pending" || run.status !== "PAUSED");
  if (done.length) {
    box.append(el("h2", { text: "Decisions" }), el("ul", { class: "decided panel" }, done.map(decidedNode)));
  }
  return box;
}

function deciderField() {
  const input = el("input", { id: "decider", value: localStorage.getItem(DECIDER_KEY) || "", placeholder: "your name", size: 24, autocomplete: "off" });
  input.addEventListener("change", () => {
    if (input.value.trim()) localStorage.setItem(DECIDER_KEY, input.value.trim());
    else localStorage.removeItem(DECIDER_KEY);
  });
  return el("label", { class: "decider" }, "Deciding as ", input, el("span", { class: "muted", text: " kept with each decision" }));
}

function askedWords(r) {
  return {
    confirmation: "asks for approval",
    user_input: "asks you to fill in fields",
    external_execution: "asks for the result of running it yourself",
    budget: "spent its budget",
  }[r.pause_type] || r.pause_type;
}

function pendingNode(run, r, ctx) {
  const call = r.tool_execution;
  const node = el("article", { class: "requirement panel", "data-requirement": r.id, "data-pause": r.pause_type });
  const head = el("header", {},
    el("code", { class: "tool", text: call ? call.tool_name : "budget" }),
    el("span", { text: askedWords(r) }),
    r.member_agent_name ? el("span", { class: "muted", text: `member ${r.member_agent_name}` }) : null,
    el("span", { class: "muted", title: when(r.created_at), text: `asked ${ago(r.created_at)}` }),
    r.deadline_at ? el("span", { class: "deadline", title: when(r.deadline_at), text: `deadline ${when(r.deadline_at)} (then: ${r.on_timeout || "reject"})` }) : null);
  node.append(head);
  if (call) node.append(el("pre", { class: "arguments", text: JSON.stringify(call.tool_args ?? {}, null, 2) }));
  if (r.budget) node.append(el("pre", { class: "arguments", text: JSON.stringify(r.budget, null, 2) }));
  const said = el("div", { class: "outcome", role: "status" });
  const send = async (decision, buttons) => {
    buttons.forEach((b) => { b.disabled = true; });
    const by = (document.getElementById("decider") || {}).value;
    const body = { ...decision, ...(by && by.trim() ? { by: by.trim() } : {}) };
    try {
      const stored = await api(`runs/${encodeURIComponent(run.run_id)}/requirements/${encodeURIComponent(r.id)}`, {
        method: "POST", body: JSON.stringify(body),
      });
      outcomes.set(r.id, { ok: true, text: `${KIND_WORDS[stored.decision.kind] || stored.decision.kind} by you` });
      ctx.reload();
    } catch (error) {
      outcomes.set(r.id, { ok: false, type: error.type, text: error.message });
      showOutcome(said, r.id);
      buttons.forEach((b) => { b.disabled = false; });
    }
  };
  node.append(controls(r, send), said);
  showOutcome(said, r.id);
  return node;
}

function showOutcome(box, id) {
  const o = outcomes.get(id);
  box.replaceChildren();
  box.className = o ? `outcome ${o.ok ? "ok" : "refused"}` : "outcome";
  if (!o) return;
  if (o.type) box.dataset.type = o.type;
  box.append(el("b", { text: o.ok ? "Done: " : `Refused (${o.type}): ` }), o.text);
}

// The buttons and fields for what the requirement asks; `send(decision, buttons)` posts one.
function controls(r, send) {
  const box = el("div", { class: "decide" });
  const buttons = [];
  const button = (id, text, cls, make) => {
    const b = el("button", { type: "button", class: `${cls} ${id}`, "data-action": id, text });
    b.addEventListener("click", () => { const d = make(); if (d) send(d, buttons); });
    buttons.push(b);
    return b;
  };
  if (r.pause_type === "budget") {
    const tokens = el("input", { type: "number", name: "max_tokens", min: 1, placeholder: "max tokens" });
    const cost = el("input", { type: "number", name: "max_cost", min: 0, step: "any", placeholder: "max cost" });
    box.append(tokens, cost, button("raise", "Raise budget", "", () => {
      const values = {};
      if (tokens.value) values.max_tokens = Number(tokens.value);
      if (cost.value) values.max_cost = Number(cost.value);
      return { kind: "budget", values };
    }));
    return box;
  }
  if (r.pause_type === "confirmation") box.append(button("approve", "Approve", "ok", () => ({ kind: "confirm" })));
  if (r.pause_type === "user_input") {
    const fields = (r.user_input_schema || []).map((f) => [f, fieldInput(f)]);
    box.append(el("div", { class: "fields" }, fields.map(([f, input]) => el("label", {},
      el("span", { text: f.name }), input, f.description ? el("span", { class: "muted", text: f.description }) : null))));
    box.append(button("answer", "Send answer", "ok", () => ({ kind: "input", values: Object.fromEntries(fields.map(([f, input]) => [f.name, fieldValue(f, input)])) })));
  }
  if (r.pause_type === "external_execution") {
    const result = el("textarea", { name: "result", rows: 3, placeholder: "what running it returned: the model reads it" });
    box.append(result, button("result", "Send result", "ok", () => ({ kind: "result", result: result.value })));
  }
  const note = el("input", { name: "note", placeholder: "a note for the model (optional)", size: 36 });
  box.append(el("span", { class: "reject-with" }, note, button("reject", "Reject", "danger", () => ({ kind: "reject", ...(note.value ? { note: note.value } : {}) }))));
  return box;
}

function fieldInput(field) {
  const name = field.name;
  if (field.type === "boolean") return el("input", { type: "checkbox", name });
  if (field.type === "integer" || field.type === "number") return el("input", { type: "number", name, step: field.type === "integer" ? 1 : "any" });
  if (field.type === "array" || field.type === "object") return el("textarea", { name, rows: 2, placeholder: "JSON" });
  return el("input", { name, size: 36 });
}

// A field's value as the type the tool states for it: the API checks the names, the tool the rest.
function fieldValue(field, input) {
  if (field.type === "boolean") return input.checked;
  if (field.type === "integer" || field.type === "number") return input.value === "" ? null : Number(input.value);
  if (field.type === "array" || field.type === "object") {
    try { return JSON.parse(input.value); } catch (_) { return input.value; }
  }
  return input.value;
}

function decidedNode(r) {
  const call = r.tool_execution;
  const d = r.decision;
  const words = d ? (KIND_WORDS[d.kind] || d.kind) : r.status;
  const o = outcomes.get(r.id);
  return el("li", { class: `decision k-${d ? d.kind : r.status}`, "data-requirement": r.id, "data-status": r.status },
    el("code", { text: call ? call.tool_name : r.pause_type }),
    call ? el("span", { class: "muted mono", text: ` ${JSON.stringify(call.tool_args ?? {}).slice(0, 120)}` }) : null,
    el("b", { text: ` ${words}` }),
    r.decided_by ? el("span", { text: ` by ${r.decided_by}` }) : null,
    r.decided_at ? el("span", { class: "muted", title: when(r.decided_at), text: ` · ${ago(r.decided_at)}` }) : null,
    d && d.note ? el("div", { class: "muted", text: `note: ${d.note}` }) : null,
    d && d.result ? el("div", { class: "muted", text: `result: ${d.result.slice(0, 600)}` }) : null,
    d && d.values ? el("div", { class: "muted mono", text: JSON.stringify(d.values).slice(0, 600) }) : null,
    o && !o.ok ? el("div", { class: "outcome refused", "data-type": o.type, text: `Refused (${o.type}): ${o.text}` }) : null);
}
