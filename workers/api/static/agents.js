// The agents page of the run pages (#/agents): the agent catalog, every agent and team a worker
// ever served (GET /agents), with its model, tools, members, whether a live worker serves it, and
// links to its runs and to the playground; one agent (#/agents/NAME, GET /agents/{name}) with its
// definition, each tool's argument schema, its budgets and fallback models, and every version
// workers served. Definitions come from workers' code, not from users, but are still written as
// text. Loaded before app.js, whose helpers (el, api, when, ago, definitionNode) it calls.
"use strict";

function agentsView() {
  const main = document.getElementById("main");
  document.body.dataset.view = "agents";
  let stopped = false;
  const body = el("tbody");
  const table = el("table", { class: "runs panel", id: "agents" },
    el("thead", {}, el("tr", {}, ["Agent", "Kind", "Model", "Tools", "Members", "Served", "Versions", ""]
      .map((h) => el("th", { text: h })))),
    body);
  main.replaceChildren(el("h1", { text: "Agents" }),
    el("p", { class: "muted", text: "What the workers serve, as each wrote it into the catalog when it started (and marks seen while it lives)." }),
    table);

  (async () => {
    try {
      const answer = await api("agents");
      if (stopped) return;
      body.replaceChildren(...answer.agents.map(agentRow));
      if (!answer.agents.length) {
        body.append(el("tr", {}, el("td", { colspan: 8, class: "empty", text: "No worker has served an agent yet: start one with `ratchet worker --app your.module`." })));
      }
      document.body.dataset.state = "ready";
    } catch (error) {
      if (!stopped) flash(error.message);
    }
  })();
  return { stop() { stopped = true; } };
}

function servedBadge(live, lastSeen) {
  return live ? el("span", { class: "badge s-COMPLETED", text: "live" })
    : el("span", { class: "muted", title: when(lastSeen), text: `last seen ${ago(lastSeen)}` });
}

function agentRow(agent) {
  const d = agent.latest;
  const name = encodeURIComponent(agent.name);
  return el("tr", { "data-agent": agent.name, "data-live": agent.live ? "true" : "false" },
    el("td", {}, el("a", { href: `#/agents/${name}`, text: agent.name })),
    el("td", { text: d.kind }),
    el("td", { class: "mono", text: modelName(d.model) }),
    el("td", { class: "tools-cell", text: d.tools.map((t) => t.name).join(", ") || "–" }),
    el("td", { text: d.members.join(", ") || "–" }),
    el("td", {}, servedBadge(agent.live, agent.last_seen)),
    el("td", { class: "num", text: agent.versions }),
    el("td", { class: "links" },
      el("a", { href: `#/?agent=${name}`, text: "Runs" }), " · ",
      el("a", { href: `#/playground?agent=${name}`, class: "try", text: "Try it" })));
}

function agentView(agentName) {
  const main = document.getElementById("main");
  document.body.dataset.view = "agent";
  main.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  let stopped = false;

  (async () => {
    try {
      const agent = await api(`agents/${encodeURIComponent(agentName)}`);
      if (stopped) return;
      main.replaceChildren(renderAgent(agent));
      document.body.dataset.state = "ready";
    } catch (error) {
      if (stopped) return;
      flash(error.message);
      if (error.status === 404) main.replaceChildren(el("p", { class: "empty", text: `No worker has served an agent named ${agentName}.` }));
    }
  })();
  return { stop() { stopped = true; } };
}

function renderAgent(agent) {
  const d = agent.latest;
  const name = encodeURIComponent(agent.name);
  const out = document.createDocumentFragment();
  out.append(
    el("div", { class: "crumbs" }, el("a", { href: "#/agents", text: "Agents" }), " / ", d.kind),
    el("h1", {}, el("span", { text: agent.name }), servedBadge(agent.live, agent.last_seen)),
    el("div", { class: "actions" },
      el("a", { class: "button", href: `#/playground?agent=${name}`, id: "try", text: "Try it in the playground" }),
      el("a", { href: `#/?agent=${name}`, text: "Its runs" })),
    el("h2", { text: "Definition" }), definitionNode({ definition_hash: null }, agent));
  const extra = [];
  for (const [scope, limits] of Object.entries(d.budgets || {})) {
    extra.push([`Budget per ${scope}`, Object.entries(limits).map(([k, v]) => `${k} ${v}`).join(", ")]);
  }
  for (const [list, models] of Object.entries(d.fallback_models || {})) {
    extra.push([`Falls back ${list.replace(/_/g, " ")}`, models.map(modelName).join(" → ")]);
  }
  if (extra.length) {
    out.append(el("dl", { class: "facts panel", id: "limits" }, extra.map(([k, v]) => el("div", {}, el("dt", { text: k }), el("dd", { text: v, title: v })))));
  }
  if (d.tools.length) {
    out.append(el("h2", { text: "Tools" }), el("div", { class: "panel", id: "tool-schemas" }, d.tools.map((t) =>
      el("details", { class: "tool-schema", "data-tool": t.name },
        el("summary", {}, el("code", { text: t.name }), ` ${t.description}`),
        el("pre", { text: JSON.stringify(t.parameters, null, 2) })))));
  }
  out.append(el("h2", { text: "Versions" }), el("table", { class: "runs panel", id: "versions" },
    el("thead", {}, el("tr", {}, ["Hash", "Kind", "Model", "Tools", "First seen", "Last seen", "Served"].map((h) => el("th", { text: h })))),
    el("tbody", {}, agent.definitions.map((v) => el("tr", { "data-hash": v.definition_hash },
      el("td", { class: "mono", title: v.definition_hash, text: v.definition_hash.slice(0, 12) }),
      el("td", { text: v.kind }),
      el("td", { class: "mono", text: modelName(v.model) }),
      el("td", { text: v.tools.map((t) => t.name).join(", ") || "–" }),
      el("td", { title: when(v.first_seen), text: ago(v.first_seen) }),
      el("td", { title: when(v.last_seen), text: ago(v.last_seen) }),
      el("td", {}, servedBadge(v.live, v.last_seen)))))));
  return out;
}
