// The overview's charts: figures built on the server (json_script), drawn with the Plotly bundle we serve.
(function () {
  "use strict";
  var script = document.getElementById("overview-js");
  var tailUrl = script ? script.dataset.tailUrl : "/overview/tail/";
  var config = { responsive: true, displaylogo: false, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  // One chart per task, top of the page first: the page is usable before the last chart is drawn.
  var charts = Array.prototype.slice.call(document.querySelectorAll("[data-figure]"));
  function drawNext() {
    var el = charts.shift();
    if (!el) return;
    var source = document.getElementById(el.dataset.figure);
    if (source && window.Plotly) {
      var figure = JSON.parse(source.textContent);
      window.Plotly.newPlot(el, figure.data, figure.layout, config).then(function () {
        if (el.id === "chart-tail") listenToTail(el);
      });
    }
    setTimeout(drawNext, 0);
  }
  setTimeout(drawNext, 0);

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
