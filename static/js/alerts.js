// Live alerts: a WebSocket to /ws/alerts that catches up from the last alert id seen, then
// streams new ones. One row per alert id (catch-up and live may overlap), newest on top; a pause
// buffers what arrives; reconnects with a growing delay; verdicts are posted with fetch.
(function () {
  "use strict";

  const MAX_ROWS = 500; // older rows leave the page (they stay in the database and the run's detail)
  const BACKOFF_MIN_MS = 500;
  const BACKOFF_MAX_MS = 30000;
  const PING_MS = 25000; // keeps proxies from closing an idle socket
  const CLOSE_BAD_REQUEST = 4400;
  const CLOSE_UNAUTHENTICATED = 4401;
  const CLOSE_TOO_MANY = 4429; // this user has too many alerts pages open
  const LABELS = { true_loop: "true loop", false_alarm: "false alarm" };
  // A kind in shadow: stored as observe, saying what it would have done (as the row template does).
  const SHADOW = {
    correct: "would have corrected",
    handoff: "would have handed off",
    terminate: "would have terminated",
  };

  const config = JSON.parse(document.getElementById("alerts-config").textContent);
  const body = document.getElementById("alerts");
  const rowTemplate = document.getElementById("alert-row");
  const empty = document.getElementById("no-alerts");
  const status = document.getElementById("live-status");
  const pauseButton = document.getElementById("pause");
  const bufferedNote = document.getElementById("buffered");
  const filters = document.getElementById("alert-filters");
  const canMark = new Set(config.can_mark);

  const seen = new Set(); // alert ids on the page or in the buffer
  let lastId = config.after; // the newest id received: where a reconnect catches up from
  let paused = false;
  let buffer = [];
  let socket = null;
  let attempts = 0;
  let pingTimer = null;

  for (const row of body.querySelectorAll("tr.alert")) seen.add(Number(row.dataset.id));

  function setStatus(state, text) {
    status.dataset.state = state;
    status.textContent = text;
  }

  function fill(row, field, text) {
    const el = row.querySelector(`[data-f="${field}"]`);
    if (el) el.textContent = text;
    return el;
  }

  function renderFeedback(row, fb) {
    const label = fill(row, "feedback", LABELS[fb.feedback] || "");
    label.className = `fb fb-${fb.feedback}`;
    fill(row, "feedback_by", fb.feedback_by ? `by ${fb.feedback_by}` : "");
    const note = fill(row, "feedback_note", fb.feedback_note || "");
    note.hidden = !fb.feedback_note;
  }

  function buildRow(alert) {
    const row = rowTemplate.content.firstElementChild.cloneNode(true);
    row.id = `alert-${alert.id}`;
    row.dataset.id = alert.id;
    row.dataset.tenant = alert.tenant_id;
    row.className = `alert act-${alert.action} fresh`;
    const time = fill(row, "ts", alert.ts.slice(0, 19).replace("T", " "));
    time.setAttribute("datetime", alert.ts);
    const action = fill(row, "action", alert.shadow ? SHADOW[alert.shadow] || alert.shadow : alert.action);
    action.className = `pill act-${alert.action}${alert.shadow ? " shadow" : ""}`;
    fill(row, "kind", alert.kind);
    const run = fill(row, "run", alert.run_id);
    run.href = `${config.runs_url}${alert.run}/?seq=${alert.seq}#det-${alert.id}`;
    fill(row, "tenant", config.multi_tenant ? config.tenants[alert.tenant_id] || "" : "");
    fill(row, "agent", alert.agent || "");
    fill(row, "backend", alert.model ? `${alert.backend} / ${alert.model}` : alert.backend);
    fill(row, "tool", alert.tool || "");
    fill(row, "count", String(alert.count));
    fill(row, "hint", alert.hint || "");
    renderFeedback(row, alert);
    const form = row.querySelector("form.mark");
    if (form) {
      if (canMark.has(alert.tenant_id)) {
        form.action = config.feedback_url.replace("/0/", `/${alert.id}/`);
        const next = form.querySelector('input[name="next"]');
        if (next) next.value = location.pathname + location.search;
      } else {
        form.remove();
      }
    }
    return row;
  }

  function show(alert) {
    body.insertBefore(buildRow(alert), body.firstChild);
    empty.hidden = true;
    const rows = body.querySelectorAll("tr.alert");
    for (let i = MAX_ROWS; i < rows.length; i++) rows[i].remove();
  }

  function receive(alert) {
    if (seen.has(alert.id)) return;
    seen.add(alert.id);
    lastId = Math.max(lastId, alert.id);
    if (paused) {
      buffer.push(alert);
      bufferedNote.hidden = false;
      bufferedNote.textContent = `${buffer.length} new while paused`;
    } else {
      show(alert);
    }
  }

  pauseButton.addEventListener("click", () => {
    paused = !paused;
    pauseButton.textContent = paused ? "resume" : "pause";
    pauseButton.setAttribute("aria-pressed", String(paused));
    if (!paused) {
      buffer.sort((a, b) => a.id - b.id).forEach(show);
      buffer = [];
      bufferedNote.hidden = true;
    }
    if (socket && socket.readyState === WebSocket.OPEN) setLive();
  });

  function setLive() {
    setStatus(paused ? "paused" : "live", paused ? "paused (still receiving)" : "live");
  }

  function connect() {
    const query = new URLSearchParams(config.query);
    query.set("after", String(lastId));
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    socket = new WebSocket(`${scheme}//${location.host}/ws/alerts?${query}`);
    socket.addEventListener("open", () => {
      attempts = 0;
      setLive();
      pingTimer = setInterval(() => socket.readyState === WebSocket.OPEN && socket.send("ping"), PING_MS);
    });
    socket.addEventListener("message", (event) => {
      if (event.data === "pong") return;
      const message = JSON.parse(event.data);
      if (message.type === "catch_up") {
        message.alerts.forEach(receive);
        if (message.more) setStatus("live", "live — older missed alerts were left out; reload for the full list");
      } else if (message.type === "alert") {
        receive(message.alert);
      } else if (message.type === "feedback") {
        const row = document.getElementById(`alert-${message.feedback.id}`);
        if (row) renderFeedback(row, message.feedback);
        const waiting = buffer.find((a) => a.id === message.feedback.id);
        if (waiting) Object.assign(waiting, message.feedback);
      } else if (message.type === "error") {
        setStatus("error", message.detail);
      }
    });
    socket.addEventListener("close", (event) => {
      clearInterval(pingTimer);
      if (event.code === CLOSE_UNAUTHENTICATED) {
        setStatus("signed-out", "signed out — reload the page to sign in again");
        return;
      }
      if (event.code === CLOSE_BAD_REQUEST) return; // the error message says why; retrying will not help
      if (event.code === CLOSE_TOO_MANY) {
        // A place frees when another page closes: try again now and then, not in a hurry.
        setStatus("error", `too many alerts pages open — close one; trying again in ${BACKOFF_MAX_MS / 1000} s`);
        setTimeout(connect, BACKOFF_MAX_MS);
        return;
      }
      const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** attempts) * (0.75 + Math.random() / 2);
      attempts += 1;
      setStatus("reconnecting", `disconnected — reconnecting in ${Math.round(delay / 1000)} s`);
      setTimeout(connect, delay);
    });
  }

  // Verdicts: the same form works without script (post and come back); with it, no reload.
  body.addEventListener("submit", async (event) => {
    const form = event.target.closest("form.mark");
    if (!form) return;
    event.preventDefault();
    const data = new FormData(form);
    if (event.submitter) data.set(event.submitter.name, event.submitter.value);
    const row = form.closest("tr");
    form.querySelectorAll("button").forEach((b) => (b.disabled = true));
    try {
      const response = await fetch(form.action, {
        method: "POST",
        body: data,
        headers: { Accept: "application/json", "X-CSRFToken": data.get("csrfmiddlewaretoken") },
        credentials: "same-origin",
      });
      if (!(response.headers.get("Content-Type") || "").includes("application/json")) {
        // A session that ended answers with the login page (after a redirect), not JSON.
        throw new Error(response.redirected ? "signed out — reload the page to sign in" : `HTTP ${response.status}`);
      }
      const answer = await response.json();
      if (!response.ok) throw new Error(answer.detail || `HTTP ${response.status}`);
      renderFeedback(row, answer);
      form.querySelector('input[name="note"]').value = "";
    } catch (error) {
      fill(row, "feedback_by", `not saved: ${error.message}`);
    } finally {
      form.querySelectorAll("button").forEach((b) => (b.disabled = false));
    }
  });

  // Filters reload the page: the list is filtered by the server, the socket by the same rules.
  filters.addEventListener("change", () => filters.submit());

  connect();
})();
