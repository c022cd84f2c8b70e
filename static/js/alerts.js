// Incidents, live: a WebSocket to /ws/alerts that catches up from the last alert id seen, then
// streams new alerts, each with its incident as it is now. An alert of an incident on the page
// updates its row in place (rows have a fixed height: nothing moves); a new incident goes on top,
// unless the pointer or the focus is in the list, or the page is paused: then it waits behind the
// "N new" button. Verdicts are posted with fetch and name the incident of their row.
(function () {
  "use strict";

  const MAX_ROWS = 500; // older rows leave the page (they stay in the database: "older incidents")
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
  const table = document.getElementById("incident-table");
  const body = document.getElementById("alerts");
  const rowTemplate = document.getElementById("alert-row");
  const empty = document.getElementById("no-alerts");
  const status = document.getElementById("live-status");
  const pauseButton = document.getElementById("pause");
  const newBar = document.getElementById("new-bar");
  const filters = document.getElementById("alert-filters");
  const canMark = new Set(config.can_mark);

  const shown = new Set(); // incident ids with a row
  let waiting = new Map(); // incident id -> incident, not shown yet (held or paused)
  let lastId = config.after; // the newest alert id received: where a reconnect catches up from
  let paused = false;
  let pointerIn = false;
  let socket = null;
  let attempts = 0;
  let reconnectTimer = null; // a reconnect waiting out its backoff
  let pingTimer = null;

  for (const row of body.querySelectorAll("tr.incident")) shown.add(Number(row.dataset.id));

  function setStatus(state, text) {
    status.dataset.state = state;
    status.textContent = text;
  }

  function fill(row, field, text) {
    const el = row.querySelector(`[data-f="${field}"]`);
    if (el) el.textContent = text;
    return el;
  }

  function when(iso) {
    return (iso || "").slice(0, 19).replace("T", " ");
  }

  function path(incident) {
    const seen = [];
    for (const step of incident.steps || []) {
      const name = step.shadow || step.action;
      if (!seen.includes(name)) seen.push(name);
    }
    return seen.join(" → ");
  }

  function renderVerdict(row, v) {
    const label = fill(row, "verdict", LABELS[v.verdict] || "");
    label.className = `fb fb-${v.verdict}`;
    // The verdict this browser just gave keeps its confirmation when the tenant's broadcast of the
    // same verdict arrives after the answer (which comes first is the network's choice).
    const mine = row.dataset.confirmed === `${v.verdict}|${v.verdict_by || ""}`;
    const who = v.verdict_by ? `by ${v.verdict_by}` : "";
    const by = fill(row, "verdict_by", mine ? `${who} (incident ${v.id})` : who);
    by.title = v.verdict_note || "";
    row.classList.toggle("resolved", v.status === "resolved");
  }

  // The fields an incident's row shows; used for new rows and for updates in place.
  function render(row, incident) {
    row.dataset.id = incident.id;
    row.dataset.tenant = incident.tenant_id;
    row.className = `incident act-${incident.action}${incident.status === "resolved" ? " resolved" : ""}`;
    const first = fill(row, "first_seen", when(incident.first_seen).slice(11));
    first.setAttribute("datetime", incident.first_seen);
    first.title = `began ${when(incident.first_seen)} UTC`;
    fill(row, "first_day", when(incident.first_seen).slice(5, 10));
    const action = fill(row, "action", incident.shadow ? SHADOW[incident.shadow] || incident.shadow : incident.action);
    action.className = `pill act-${incident.action}${incident.shadow ? " shadow" : ""}`;
    fill(row, "kind", incident.kind);
    fill(row, "tool", incident.tool || "");
    const run = fill(row, "run", incident.run_id);
    run.href = `${config.runs_url}${incident.run}/#incidents`;
    fill(row, "agent", incident.agent || "");
    fill(row, "tenant", config.multi_tenant ? config.tenants[incident.tenant_id] || "" : "");
    fill(row, "backend", incident.backend || "");
    fill(row, "model", incident.model || "");
    const alerts = fill(row, "alerts", `${incident.alerts} alert${incident.alerts === 1 ? "" : "s"}`);
    alerts.href = config.incident_url.replace("/0/", `/${incident.id}/`);
    fill(row, "path", path(incident));
    const hint = fill(row, "hint", incident.hint || "");
    hint.title = incident.hint || "";
    const last = fill(row, "last_seen", when(incident.last_seen).slice(11));
    last.setAttribute("datetime", incident.last_seen);
    if (incident.reached) fill(row, "reached", incident.reached);
    renderVerdict(row, incident);
  }

  function buildRow(incident) {
    const row = rowTemplate.content.firstElementChild.cloneNode(true);
    row.id = `incident-${incident.id}`;
    render(row, incident);
    row.classList.add("fresh");
    const form = row.querySelector("form.mark");
    if (form) {
      if (canMark.has(incident.tenant_id)) {
        form.action = config.verdict_url.replace("/0/", `/${incident.id}/`);
        form.querySelector('input[name="incident"]').value = String(incident.id);
        const next = form.querySelector('input[name="next"]');
        if (next) next.value = location.pathname + location.search;
      } else {
        form.remove();
      }
    }
    return row;
  }

  function held() {
    return paused || pointerIn || table.contains(document.activeElement) || !config.live;
  }

  function showWaiting() {
    const incidents = [...waiting.values()].sort((a, b) => a.id - b.id);
    waiting = new Map();
    for (const incident of incidents) {
      if (shown.has(incident.id)) continue;
      shown.add(incident.id);
      body.insertBefore(buildRow(incident), body.firstChild);
    }
    if (incidents.length) empty.hidden = true;
    const rows = body.querySelectorAll("tr.incident");
    for (let i = MAX_ROWS; i < rows.length; i++) {
      shown.delete(Number(rows[i].dataset.id));
      rows[i].remove();
    }
    updateBar();
  }

  function updateBar() {
    const n = waiting.size;
    newBar.hidden = n === 0;
    newBar.textContent = config.live ? `${n} new — show` : `${n} new — go to the newest`;
  }

  function receive(alert) {
    lastId = Math.max(lastId, alert.id);
    const incident = alert.incident;
    if (!incident) return;
    if (config.status && incident.status !== config.status) return;
    const row = document.getElementById(`incident-${incident.id}`);
    if (row) {
      render(row, incident); // in place: the row keeps its place and its height
      return;
    }
    waiting.set(incident.id, incident);
    if (held()) updateBar();
    else showWaiting();
  }

  table.addEventListener("pointerenter", () => (pointerIn = true));
  table.addEventListener("pointerleave", () => {
    pointerIn = false;
    if (!held() && waiting.size) showWaiting();
  });
  table.addEventListener("focusout", () => {
    // After the focus has moved: it may have moved to another control of the list.
    setTimeout(() => !held() && waiting.size && showWaiting(), 0);
  });
  newBar.addEventListener("click", () => {
    if (!config.live) {
      location.search = new URLSearchParams(Object.entries({ ...config.query, status: config.status }).filter(([, v]) => v)).toString();
      return;
    }
    showWaiting();
  });

  pauseButton.addEventListener("click", () => {
    paused = !paused;
    pauseButton.textContent = paused ? "resume" : "pause";
    pauseButton.setAttribute("aria-pressed", String(paused));
    if (!held()) showWaiting();
    if (socket && socket.readyState === WebSocket.OPEN) setLive();
  });

  function setLive() {
    setStatus(paused ? "paused" : "live", paused ? "paused (still receiving)" : "live");
  }

  function connect() {
    reconnectTimer = null;
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
      } else if (message.type === "verdict") {
        const row = document.getElementById(`incident-${message.verdict.id}`);
        if (row) renderVerdict(row, message.verdict);
        const pending = waiting.get(message.verdict.id);
        if (pending) Object.assign(pending, message.verdict);
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
      reconnectTimer = setTimeout(connect, delay);
    });
  }

  // Verdicts: the same form works without script (post and come back); with it, no reload. The
  // form carries the incident id of its row: the server refuses a verdict sent for another one.
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
      row.dataset.confirmed = `${answer.verdict}|${answer.verdict_by || ""}`;
      renderVerdict(row, answer);
      form.querySelector('input[name="note"]').value = "";
    } catch (error) {
      fill(row, "verdict_by", `not saved: ${error.message}`);
    } finally {
      form.querySelectorAll("button").forEach((b) => (b.disabled = false));
    }
  });

  // Filters reload the page: the list is filtered by the server, the socket by the same rules.
  filters.addEventListener("change", () => filters.submit());

  // The network is back (a laptop woke up, Wi-Fi returned): try now rather than wait out a backoff
  // that grew while it was away (up to BACKOFF_MAX_MS).
  window.addEventListener("online", () => {
    if (reconnectTimer === null) return;
    clearTimeout(reconnectTimer);
    reconnectTimer = null;
    connect();
  });
  connect();
})();
