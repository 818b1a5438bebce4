// The list of runs' batch: runs picked by their checkboxes, continued or cancelled together
// (POST /batches/continue, POST /batches/cancel: at most 100 runs a request, so a larger pick goes in
// several), each run's outcome said on its own, a refusal with the API's reason. The "Failed"
// filter (status=ERROR) shows what a batch continue resumes. Uses app.js's helpers (loaded after
// this file, called only once the list is drawn). Everything a run holds is written as text.
"use strict";

const BATCH_MAX = 100; // as the API bounds a batch (orchestrator/batches.py)
const picked = new Set(); // the runs picked, by id: kept while the list reads itself again

function batchBar(reload) {
  const count = el("span", { id: "batch-count", class: "muted" });
  const go = (action, label) => el("button", { type: "button", id: `batch-${action}`, class: action === "cancel" ? "danger" : "",
    text: label, onclick: () => send(action) });
  const resume = go("continue", "Continue selected");
  const stop = go("cancel", "Cancel selected");
  const clear = el("button", { type: "button", class: "ghost", text: "Clear selection", onclick: () => { picked.clear(); changed(); } });
  const outcome = el("div", { id: "batch-outcome", class: "outcome", "aria-live": "polite" });
  const all = el("input", { type: "checkbox", id: "pick-all", "aria-label": "select every run shown",
    onchange: () => { for (const box of document.querySelectorAll("input.pick")) toggle(box, all.checked); changed(); } });
  const node = el("div", { class: "batch panel" }, count, resume, stop, clear, outcome);
  let shown = [];

  function toggle(box, on) {
    box.checked = on;
    if (on) picked.add(box.dataset.run); else picked.delete(box.dataset.run);
  }

  function changed() {
    for (const box of document.querySelectorAll("input.pick")) box.checked = picked.has(box.dataset.run);
    const n = picked.size;
    count.textContent = n ? `${n} selected` : "Select runs to continue or cancel them together";
    resume.disabled = stop.disabled = !n;
    all.checked = shown.length > 0 && shown.every((id) => picked.has(id));
  }

  async function send(action) {
    const ids = [...picked];
    resume.disabled = stop.disabled = true;
    outcome.className = "outcome";
    outcome.textContent = action === "continue" ? "Continuing…" : "Cancelling…";
    const results = [];
    try {
      for (let i = 0; i < ids.length; i += BATCH_MAX) {
        const batch = await api(`batches/${action}`, { method: "POST", body: JSON.stringify({ run_ids: ids.slice(i, i + BATCH_MAX) }) });
        results.push(...batch.results);
      }
    } catch (error) { // the whole request refused (a token, the network): nothing of it was done
      outcome.className = "outcome refused";
      outcome.textContent = `${error.type}: ${error.message}`;
      changed();
      return;
    }
    for (const result of results) if (result.ok) picked.delete(result.run_id);
    said(action, results);
    changed();
    reload();
  }

  function said(action, results) {
    const done = results.filter((r) => r.ok);
    const refused = results.filter((r) => !r.ok);
    outcome.className = refused.length ? "outcome refused" : "outcome ok";
    outcome.replaceChildren(
      el("div", { class: "summary", text: `${action === "continue" ? "Continued" : "Cancelled"} ${done.length} · refused ${refused.length}` }),
      refused.length ? el("ul", { class: "refusals" }, refused.map((r) =>
        el("li", { "data-run": r.run_id }, runLink(r.run_id), ` ${r.error}: ${r.reason}`))) : "");
  }

  return {
    node,
    all,
    // The list drew these runs: the pick keeps only runs still shown (a run that left the filter
    // is not acted on unseen).
    drawn(runs) {
      shown = runs.map((r) => r.run_id);
      for (const id of [...picked]) if (!shown.includes(id)) picked.delete(id);
      changed();
    },
    cell(run) {
      const box = el("input", { type: "checkbox", class: "pick", "data-run": run.run_id, "aria-label": `select run ${run.run_id}`,
        checked: picked.has(run.run_id), onchange: () => { toggle(box, box.checked); changed(); } });
      return el("td", { class: "pick", onclick: (event) => event.stopPropagation() }, box);
    },
  };
}
