// The schedules page of the run pages (#/schedules): every schedule the token may read, its cron
// and zone, its next tick, and its last run, linked to that run's page. Read from GET /schedules;
// created and deleted with `ratchet schedule` or the API. Uses app.js's helpers (loaded after
// this file, called only once the page routes here). Everything is written as text.
"use strict";

function schedulesView() {
  const main = document.getElementById("main");
  document.body.dataset.view = "schedules";
  let stopped = false;
  const body = el("tbody");
  const table = el("table", { class: "runs panel" },
    el("thead", {}, el("tr", {}, ["Schedule", "Agent", "Cron", "Zone", "Next tick", "Last run", "User"]
      .map((h) => el("th", { text: h })))),
    body);
  main.replaceChildren(el("h1", { text: "Schedules" }), table);

  (async () => {
    try {
      const answer = await api("schedules");
      if (stopped) return;
      body.replaceChildren(...answer.schedules.map((s) => el("tr", { "data-schedule": s.schedule_id },
        el("td", { class: "mono", text: s.schedule_id }),
        el("td", { text: s.agent_name }),
        el("td", { class: "mono", text: s.cron }),
        el("td", { text: s.timezone }),
        el("td", { text: when(s.next_at) }),
        el("td", {}, s.last_run_id ? runLink(s.last_run_id, s.last_run_id) : "-"),
        el("td", { text: s.user_id || "" }))));
      if (!answer.schedules.length) {
        body.append(el("tr", {}, el("td", { colspan: 7, class: "empty", text: "No schedules: `ratchet schedule add` makes one." })));
      }
      document.body.dataset.state = "ready";
    } catch (error) {
      if (!stopped) flash(error.message);
    }
  })();
  return { stop() { stopped = true; } };
}
