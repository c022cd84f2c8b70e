// Times in the viewer's time zone: every <time data-local> the server wrote in UTC (its title keeps
// the UTC time, shown on hover). Loaded on every page.
(function () {
  "use strict";
  function pad(n) {
    return n < 10 ? "0" + n : String(n);
  }
  function local(date, seconds) {
    var text =
      date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) + " " +
      pad(date.getHours()) + ":" + pad(date.getMinutes());
    return seconds ? text + ":" + pad(date.getSeconds()) : text;
  }
  var zone = "";
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
  } catch (e) {
    zone = "";
  }
  function localize(root) {
    var times = (root || document).querySelectorAll("time[data-local]");
    for (var i = 0; i < times.length; i++) {
      var el = times[i];
      var date = new Date(el.getAttribute("datetime"));
      if (isNaN(date.getTime())) continue;
      el.textContent = local(date, el.dataset.local === "seconds");
      el.dataset.zone = zone;
    }
  }
  window.loopwatchTime = { localize: localize, local: local, zone: zone };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () {
      localize(document);
    });
  } else {
    localize(document);
  }
})();
