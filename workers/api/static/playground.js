// The playground of the run pages (#/playground): pick an agent from the catalog, write a message,
// start a run (POST /runs, streamed), watch its events arrive (GET /runs/{id}/events: its text as
// it is written, its tool calls, its end), then go on with another message (POST
// /runs/{id}/continue with input). A COMPLETED run is continued as a new run, a fork in the same
// session, and the page says so; a run in ERROR takes the message in place, under its own id, or
// goes on without one (Continue: the tool calls it still owes refuse a message until they ran).
// #/playground?agent=NAME picks the agent; ?run=RUN_ID goes on from that run. The model's text,
// tool names, arguments and results are untrusted: written as text only. Loaded before app.js,
// whose helpers (el, api, badge, runLink, readEvents, flash) and constants (FINAL, RUN_POLL_MS)
// it uses once the page routes here.
"use strict";

function playgroundView(params) {
  const main = document.getElementById("main");
  document.body.dataset.view = "playground";
  let stopped = false;
  let stream = null;
  let again = null; // the timer that follows the run again after its stream gave up
  let run = null; // the run the conversation is at: {run_id, session_id, status}
  let turn = null; // the nodes of the turn being written
  let last = "0-0-0-0"; // the last event id read of `run`
  const agent = el("select", { id: "pg-agent" }, el("option", { value: "", text: "Reading the catalog…" }));
  const session = el("input", { id: "pg-session", placeholder: "a new session", size: 24, autocomplete: "off" });
  const streamed = el("input", { type: "checkbox", id: "pg-stream", checked: true });
  const message = el("textarea", { id: "pg-message", rows: 3, placeholder: "a message to the agent" });
  const send = el("button", { type: "submit", id: "pg-send", text: "Start a run" });
  const resume = el("button", { type: "button", id: "pg-continue", class: "ghost", text: "Continue", hidden: true,
    title: "Go on from where the run stopped, without a message: the tool calls it still owes first", onclick: () => resumeRun() });
  const fresh = el("button", { type: "button", id: "pg-new", class: "ghost", text: "New conversation", onclick: () => {
    const target = `#/playground?agent=${encodeURIComponent(agent.value)}`;
    if (location.hash === target) route(); else location.hash = target; // a new view either way
  } });
  const state = el("div", { id: "pg-state", class: "pg-state" });
  const note = el("div", { id: "pg-note", class: "note", hidden: true });
  const transcript = el("div", { id: "pg-transcript", class: "pg-transcript" });
  const form = el("form", { class: "pg-composer panel", id: "pg-form" }, message, el("div", { class: "pg-send" }, send, resume, fresh));
  main.replaceChildren(el("h1", { text: "Playground" }),
    el("div", { class: "filters panel" }, el("label", {}, "Agent", agent), el("label", {}, "Session", session),
      el("label", { class: "check" }, streamed, "stream its text")),
    state, note, transcript, form);
  form.addEventListener("submit", (event) => { event.preventDefault(); submit(); });
  message.addEventListener("keydown", (event) => { if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) submit(); });

  function setRun(next) {
    run = next;
    document.body.dataset.status = next.status;
    state.replaceChildren(badge(next.status), " ", el("span", { text: next.agent_name }), " · run ", runLink(next.run_id),
      el("span", { class: "muted" }, " · session ", el("a", { href: `#/sessions/${encodeURIComponent(next.session_id)}`, class: "mono", id: "pg-session-link", text: next.session_id })),
      " · ", el("a", { href: `#/runs/${encodeURIComponent(next.run_id)}/time`, text: "time axis" }));
    const going = !FINAL.has(next.status);
    agent.disabled = true;
    session.disabled = true;
    session.value = next.session_id;
    send.textContent = "Send";
    send.disabled = going || next.status === "CANCELLED";
    resume.hidden = next.status !== "ERROR"; // a run in ERROR that owes tool calls takes no message first
    resume.disabled = false;
    if (next.status === "PAUSED") say(`The run is PAUSED: it waits for a person. Decide its calls on its page (#/runs/${next.run_id}), then come back.`);
    if (next.status === "CANCELLED") say("The run was cancelled: start a new conversation.");
  }

  function say(text, asNote = true) {
    note.hidden = !text;
    note.className = asNote ? "note" : "note ok";
    note.textContent = text || "";
  }

  function newTurn(text) {
    const answer = el("div", { class: "turn-answer" }, el("ul", { class: "pg-calls" }), el("pre", { class: "live" }));
    turn = { answer, calls: answer.firstChild, live: answer.lastChild, node: el("article", { class: "turn" }, el("div", { class: "turn-user" }, el("pre", { text })), answer) };
    transcript.append(turn.node);
  }

  function replay(past) { // a run's transcript so far, as the turns it holds
    for (const m of past.messages) {
      if (m.role === "user") newTurn(m.content || "");
      else if (!turn) continue;
      else if (m.role === "assistant" && m.tool_calls) {
        for (const c of m.tool_calls) turn.calls.append(el("li", { "data-call": c.id, "data-tool": (c.function || {}).name, text: `${(c.function || {}).name || "?"}(${String((c.function || {}).arguments || "").slice(0, 300)})` }));
      }
      if (turn && m.role === "assistant" && m.content) turn.answer.append(el("pre", { class: "final", text: m.content }));
      if (turn && m.role === "tool") {
        const call = [...turn.calls.children].find((li) => li.dataset.call === m.tool_call_id);
        if (call) call.classList.add(m.tool_call_error ? "failed" : "done");
      }
    }
    if (turn && past.messages.some((m) => m.role === "assistant" && m.content)) turn.live.remove();
  }

  function onEvent(event) {
    last = event.id;
    if (event.status) document.body.dataset.status = event.status;
    if (!turn) return;
    if (event.event === "RunContent") turn.live.textContent += event.content || "";
    else if (event.event === "StepRestarted") turn.live.textContent = "";
    else if (event.event === "ToolCallStarted" && event.tool) {
      const args = JSON.stringify(event.tool.tool_args ?? {});
      turn.calls.append(el("li", { "data-call": event.tool.tool_call_id, "data-tool": event.tool.tool_name, text: `${event.tool.tool_name}(${args.slice(0, 300)})` }));
    } else if (event.event === "ToolCallCompleted" && event.tool) {
      const call = [...turn.calls.children].find((li) => li.dataset.call === event.tool.tool_call_id)
        || turn.calls.appendChild(el("li", { "data-call": event.tool.tool_call_id, "data-tool": event.tool.tool_name, text: event.tool.tool_name }));
      call.classList.add(event.tool.tool_call_error ? "failed" : "done");
      call.append(el("div", { class: "result", text: `→ ${String(event.tool.result ?? "").slice(0, 300)}` }));
    } else if (event.event === "MemberRunStarted") {
      turn.calls.append(el("li", { class: "member", text: `member ${event.member_agent || ""} started` }));
    } else if (event.event === "RunCompleted") {
      turn.live.remove();
      turn.answer.append(el("pre", { class: "final", text: event.content ?? "" }));
    } else if (event.event === "RunError" && event.error) {
      turn.answer.append(el("div", { class: "errorbox" }, el("b", { text: event.error.type }), el("pre", { text: event.error.message })));
    }
  }

  function follow(after) {
    last = after;
    if (stream) stream.abort();
    if (again) { clearTimeout(again); again = null; }
    setLive("Live", true);
    const id = run.run_id;
    stream = readEvents(id, after, onEvent, async () => {
      stream = null;
      if (stopped) return;
      try {
        const now = await api(`runs/${encodeURIComponent(id)}`);
        if (stopped) return;
        setRun(now);
        if (!FINAL.has(now.status)) { // the stream gave up early (an error answered): read on, later
          again = setTimeout(() => { again = null; if (!stopped) follow(last); }, RUN_POLL_MS);
          return;
        }
        if (now.status === "COMPLETED" && turn && !turn.answer.querySelector(".final")) { // its end not streamed
          turn.live.remove();
          turn.answer.append(el("pre", { class: "final", text: typeof now.content === "string" ? now.content : JSON.stringify(now.content) }));
        }
        setLive(`${now.status} · read ${clock()}`, false);
        document.body.dataset.state = "ready";
      } catch (error) { flash(error.message); }
    });
  }

  async function submit() {
    const text = message.value;
    if (!text.trim() || send.disabled) return;
    send.disabled = true;
    say("");
    try {
      if (!run) await start(text);
      else await goOn(text);
      message.value = "";
    } catch (error) {
      flash(`${run ? "Continue" : "Start"}: ${error.message}`);
      if (run && run.status === "ERROR") say(`Not sent: ${error.message}`); // e.g. owed tool calls: use Continue
      send.disabled = false;
    }
  }

  async function resumeRun() { // POST /runs/{id}/continue with no input: the run goes on in place
    if (!run || run.status !== "ERROR" || resume.disabled) return;
    const from = run;
    resume.disabled = send.disabled = true;
    say("");
    try {
      const next = await api(`runs/${encodeURIComponent(from.run_id)}/continue`, { method: "POST", body: "{}" });
      say(`Continued in place without a message: the same run, ${next.run_id}, goes on from where it stopped.`, false);
      if (turn && !turn.live.isConnected) turn.answer.append(turn.live = el("pre", { class: "live" }));
      setRun(next);
      follow(lastEventId(from)); // what it holds already is not read again
    } catch (error) {
      say(`Continue: ${error.message}`); // the API's refusal, as it said it
      resume.disabled = send.disabled = false;
    }
  }

  async function start(text) {
    if (!agent.value) throw new Error("pick an agent first");
    const body = { agent: agent.value, input: text, stream: streamed.checked };
    if (session.value.trim()) body.session_id = session.value.trim();
    const started = await api("runs", { method: "POST", body: JSON.stringify(body) });
    newTurn(text);
    setRun(started);
    follow("0-0-0-0");
  }

  async function goOn(text) {
    const from = run;
    const next = await api(`runs/${encodeURIComponent(from.run_id)}/continue`, { method: "POST", body: JSON.stringify({ input: text }) });
    newTurn(text);
    if (next.run_id !== from.run_id) {
      say(`Continued as a new run, ${next.run_id}: a ${from.status} run is not changed, so its conversation goes on in a fork of it, in the same session (${next.session_id}).`, false);
    } else {
      say(`Continued in place: the same run, ${next.run_id}, takes the message.`, false);
    }
    setRun(next);
    // From the message on: what came before it (a fork's copy too, an old error) is not read again.
    // Counted on the run as it stopped, not on the answer, which a fast worker may have moved on.
    follow(lastEventId(from, 1));
  }

  async function load() {
    try {
      const [catalog, from] = await Promise.all([api("agents"), params.get("run") ? api(`runs/${encodeURIComponent(params.get("run"))}`) : null]);
      if (stopped) return;
      const names = catalog.agents.map((a) => a.name);
      agent.replaceChildren(...catalog.agents.map((a) => el("option", { value: a.name, text: a.live ? a.name : `${a.name} (no live worker)` })));
      if (!names.length) agent.append(el("option", { value: "", text: "No agent in the catalog" }));
      const wanted = from ? from.agent_name : params.get("agent");
      if (wanted && names.includes(wanted)) agent.value = wanted;
      if (from) {
        replay(from);
        setRun(from);
        say(`Going on from run ${from.run_id}: what you send next continues it.`, false);
        if (!FINAL.has(from.status)) follow(lastEventId(from));
      }
      document.body.dataset.state = "ready";
    } catch (error) {
      if (!stopped) flash(error.message);
    }
  }

  load();
  return { stop() { stopped = true; if (stream) stream.abort(); if (again) clearTimeout(again); } };
}

// The id after which a run's events are those of the messages after its first `stored + more`
// (the system message not counted): the events of what it holds now, and `more` messages on, are left out.
function lastEventId(run, more = 0) {
  return `${withoutSystem(run.messages).length + more}-0-0-0`; // sessions.js
}
