// The overview's charts: figures built on the server (json_script), drawn with the Plotly bundle we serve.
// Times on the charts are the viewer's (hover shows UTC); a bar of the loop or repeat chart opens its
// alerts; the page redraws itself every data-every seconds unless a menu is open or a chart is hovered.
(function () {
  "use strict";
  var script = document.getElementById("overview-js");
  var tailUrl = script ? script.dataset.tailUrl : "/overview/tail/";
  var alertsUrl = script ? script.dataset.alertsUrl : "/alerts/";
  var config = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
  var ISO_UTC = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/;
  var time = window.loopwatchTime;
  var utcX = {}; // chart id -> per trace, the UTC times of its bars (before they were made local)

  function utcLabel(iso) {
    return iso.slice(0, 10) + " " + iso.slice(11, 16) + " UTC";
  }
  function toLocal(iso) {
    return time ? time.local(new Date(iso), true) : iso;
  }

  // Times in the viewer's zone: x values, threshold marks; the hover says the UTC time as well.
  function localize(id, figure) {
    var kept = [];
    figure.data.forEach(function (trace) {
      var xs = trace.x || [];
      if (!xs.length || typeof xs[0] !== "string" || !ISO_UTC.test(xs[0])) {
        kept.push(null);
        return;
      }
      kept.push(xs.slice());
      trace.text = xs.map(utcLabel);
      if (trace.type === "bar") trace.textposition = "none";
      trace.x = xs.map(toLocal);
      if (trace.hovertemplate) {
        trace.hovertemplate = trace.hovertemplate.split("%{x}").join("%{x|%Y-%m-%d %H:%M} (%{text})");
      }
    });
    (figure.layout.shapes || []).forEach(function (shape) {
      if (typeof shape.x0 === "string" && ISO_UTC.test(shape.x0)) {
        shape.x0 = toLocal(shape.x0);
        shape.x1 = toLocal(shape.x1);
      }
    });
    (figure.layout.annotations || []).forEach(function (note) {
      if (typeof note.x === "string" && ISO_UTC.test(note.x)) note.x = toLocal(note.x);
    });
    utcX[id] = kept;
    return figure;
  }

  function figureOf(doc, el) {
    var source = doc.getElementById(el.dataset.figure);
    return source ? localize(el.id, JSON.parse(source.textContent)) : null;
  }

  // One chart per task, top of the page first: the page is usable before the last chart is drawn.
  var charts = Array.prototype.slice.call(document.querySelectorAll("[data-figure]"));
  var queue = charts.slice();
  function drawNext() {
    var el = queue.shift();
    if (!el) return;
    var figure = figureOf(document, el);
    if (figure && window.Plotly) {
      window.Plotly.newPlot(el, figure.data, figure.layout, config).then(function () {
        if (el.id === "chart-tail") listenToTail(el);
        if (el.id === "chart-loops") listenToLoops(el);
        if (el.id === "chart-repeats") listenToRepeats(el);
      });
    }
    setTimeout(drawNext, 0);
  }
  setTimeout(drawNext, 0);

  function sayZone() {
    var said = document.getElementById("time-zone-said");
    if (said && time && time.zone) {
      said.textContent = "Times in your time zone (" + time.zone + "); hover a time for UTC.";
    }
  }
  sayZone();

  // A bar of the loop chart opens the alerts of its backend / model, kind and time step.
  function openAlerts(values) {
    var params = new URLSearchParams();
    Object.keys(values).forEach(function (key) {
      if (values[key]) params.set(key, values[key]);
    });
    window.location.assign(alertsUrl + "?" + params.toString());
  }
  function listenToLoops(el) {
    el.on("plotly_click", function (event) {
      var point = event.points && event.points[0];
      if (!point || !point.data || !point.data.meta) return;
      var xs = (utcX[el.id] || [])[point.curveNumber];
      if (!xs) return;
      var start = xs[point.pointNumber];
      var step = (el.layout.meta && el.layout.meta.step_s) || 3600;
      var end = new Date(new Date(start).getTime() + step * 1000).toISOString().replace(/\.\d+Z$/, "Z");
      var meta = point.data.meta;
      openAlerts({ backend: meta.backend, model: meta.model, kind: meta.kind, from: start, to: end });
    });
  }
  // A bar of the repeat chart: that backend's alerts of that kind in the page's range.
  function listenToRepeats(el) {
    el.on("plotly_click", function (event) {
      var point = event.points && event.points[0];
      var c = point && point.customdata;
      if (!c) return;
      openAlerts({ backend: c[2], kind: c[3], from: c[4], to: c[5] });
    });
  }

  // A bar of the long tail lists its runs under the chart (the same list the page renders for a link).
  var target = document.getElementById("tail-runs");
  function listenToTail(tail) {
    if (!target) return;
    tail.on("plotly_click", function (event) {
      var point = event.points && event.points[0];
      if (!point || !point.customdata) return;
      var params = new URLSearchParams(window.location.search);
      params.set("metric", tail.dataset.metric);
      params.set("bin_task", point.customdata[0]);
      params.set("bin_lo", point.customdata[1]);
      params.set("bin_hi", point.customdata[2]);
      target.setAttribute("aria-busy", "true");
      fetch(tailUrl + "?" + params.toString(), { credentials: "same-origin" })
        .then(function (response) {
          return response.text().then(function (text) {
            return { ok: response.ok, text: text };
          });
        })
        .then(function (answer) {
          if (answer.ok) {
            target.innerHTML = answer.text; // rendered and escaped by the server
            history.replaceState(null, "", "?" + params.toString() + "#tail-runs");
          } else {
            target.textContent = answer.text;
          }
          target.removeAttribute("aria-busy");
          target.scrollIntoView({ block: "nearest" });
        })
        .catch(function () {
          target.textContent = "Could not load the runs: is the server reachable?";
          target.removeAttribute("aria-busy");
        });
    });
  }

  // --- refreshing itself ---------------------------------------------------------------------------
  var refreshSaid = document.getElementById("refresh-said");
  var every = refreshSaid ? parseInt(refreshSaid.dataset.every, 10) : 0;

  // Why not now: a menu open (the filters' or a chart's), a chart hovered, the tab hidden.
  function paused() {
    var active = document.activeElement;
    if (active && active.closest && active.closest("#filters") && active.tagName !== "BUTTON") {
      return "a filter menu is open";
    }
    if (document.querySelector(".updatemenu-dropdown-button-group .updatemenu-button")) {
      return "a chart's menu is open";
    }
    if (document.querySelector("[data-figure] .hoverlayer .hovertext")) return "a chart is hovered";
    if (document.hidden) return "the tab is hidden";
    if (target && target.getAttribute("aria-busy")) return "runs are loading";
    return "";
  }

  // The tail chart keeps the task type the menu shows.
  function keepTailChoice(el, figure) {
    var menu = el.layout && el.layout.updatemenus && el.layout.updatemenus[0];
    var newMenu = figure.layout.updatemenus && figure.layout.updatemenus[0];
    if (!menu || !newMenu || !el.data) return;
    var shown = el.data.filter(function (t) {
      return t.visible === true;
    })[0];
    if (!shown) return;
    var index = -1;
    figure.data.forEach(function (t, i) {
      if (t.name === shown.name) index = i;
    });
    if (index < 0) return;
    var button = newMenu.buttons[index];
    newMenu.active = index;
    figure.data.forEach(function (t, i) {
      t.visible = i === index;
    });
    figure.layout.shapes = button.args[1].shapes;
    figure.layout.annotations = button.args[1].annotations;
  }

  function redraw(doc) {
    var fresh = Array.prototype.slice.call(doc.querySelectorAll("[data-figure]")).map(function (el) {
      return el.id;
    });
    var now = charts.map(function (el) {
      return el.id;
    });
    if (fresh.join(",") !== now.join(",")) {
      // A chart appeared or went: draw the page again (rare: the first run of a range, say).
      window.location.reload();
      return;
    }
    Array.prototype.slice.call(document.querySelectorAll("[data-refresh]")).forEach(function (el) {
      var replacement = doc.getElementById(el.id);
      if (!replacement) return;
      el.replaceWith(replacement);
      if (time) time.localize(replacement);
    });
    sayZone();
    charts.forEach(function (el) {
      var source = doc.getElementById(el.dataset.figure);
      if (!source) return;
      var old = document.getElementById(el.dataset.figure);
      if (old) old.textContent = source.textContent;
      var figure = figureOf(document, el);
      if (el.id === "chart-tail") keepTailChoice(el, figure);
      window.Plotly.react(el, figure.data, figure.layout, config);
    });
  }

  var busy = false;
  function refresh() {
    var why = paused();
    if (why || busy) return Promise.resolve(why || "busy");
    busy = true;
    return fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (!response.ok) throw new Error("answer " + response.status);
        return response.text();
      })
      .then(function (html) {
        var why = paused(); // a menu opened while the page was on its way
        if (why) return why;
        redraw(new DOMParser().parseFromString(html, "text/html"));
        return "refreshed";
      })
      .catch(function (error) {
        var at = document.getElementById("refreshed-at");
        if (at) at.textContent = "not refreshed (" + error.message + "), trying again";
        return "failed";
      })
      .then(function (outcome) {
        busy = false;
        return outcome;
      });
  }
  function tick() {
    refresh().then(function (outcome) {
      // Paused: look again soon rather than a whole period later.
      setTimeout(tick, outcome === "refreshed" || outcome === "failed" ? every * 1000 : 5000);
    });
  }
  if (every > 0) setTimeout(tick, every * 1000);
  window.loopwatchOverview = { refresh: refresh, paused: paused };

  // The filter form: from/to only for a custom range; a model brings its backend along.
  var range = document.getElementById("f-range");
  var custom = document.querySelector(".custom-range");
  if (range && custom) {
    var toggle = function () {
      custom.hidden = range.value !== "custom";
    };
    toggle();
    range.addEventListener("change", toggle);
  }
  var model = document.querySelector("#filters select[name=model]");
  var backend = document.querySelector("#filters select[name=backend]");
  if (model && backend) {
    model.addEventListener("change", function () {
      var option = model.selectedOptions[0];
      if (option && option.dataset.backend) backend.value = option.dataset.backend;
    });
  }
})();
