/* The version page's exports table, live over /ws/versions/<id>/exports/ (apps.datasets.consumers.
   ExportStatesConsumer): when the states it reports differ from the table's, the table is reloaded
   (the same fragment the polling fetches). While the socket is open the 3 s htmx polling pauses
   (its trigger asks window.exportsLive()); when it closes the polling takes over again and the
   socket reconnects with backoff. 4403 / 4404 end it. While the version's exportability is being
   measured (#exportability-state), the message's "exportability" {status, done, total} updates its
   "n of m members"; when the status changes (running, done, failed) the page is reloaded: the
   export form and the counts appear once it is done. */
(function () {
  "use strict";
  var table = document.getElementById("exports-table");
  if (!table || !table.getAttribute("data-ws")) { return; }
  var wsPath = table.getAttribute("data-ws");
  var live = false, attempts = 0, MAX_DELAY_MS = 30000;
  window.exportsLive = function () { return live; };

  function shown() {  // job id -> status, as the table shows them
    var out = {};
    var el = document.getElementById("exports-table");
    if (!el) { return out; }
    el.querySelectorAll("tr[data-job]").forEach(function (row) {
      out[row.getAttribute("data-job")] = row.getAttribute("data-status");
    });
    return out;
  }

  function differs(jobs) {
    var rows = shown(), ids = Object.keys(rows).map(Number);
    var newest = ids.length ? Math.max.apply(null, ids) : 0;
    return jobs.some(function (job) {
      var status = rows[String(job[0])];
      return status === undefined ? job[0] > newest : status !== job[1];
    });
  }

  function reload() {
    var el = document.getElementById("exports-table");
    if (!el || !window.htmx) { return; }
    window.htmx.ajax("GET", el.getAttribute("data-fragment"), {target: "#exports-table", swap: "outerHTML"})
      .then(function () { mark("live"); });
  }

  function measuring(state) {  // the exportability line; true when the page must be reloaded
    var el = document.getElementById("exportability-state");
    if (!el) { return false; }
    if (!state || state.status !== el.getAttribute("data-status")) { return true; }
    var done = el.querySelector("[data-done]"), total = el.querySelector("[data-total]");
    if (done) { done.textContent = String(state.done); }
    if (total) { total.textContent = String(state.total); }
    return false;
  }

  function mark(state) {
    var el = document.getElementById("exports-table");
    if (el) { el.setAttribute("data-live-state", state); }
  }

  function open() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(scheme + window.location.host + wsPath);
    ws.onopen = function () { live = true; attempts = 0; mark("live"); };
    ws.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (!message || message.type !== "exports") { return; }
      if (measuring(message.exportability)) { window.location.reload(); return; }
      if (Array.isArray(message.jobs) && differs(message.jobs)) { reload(); }
    };
    ws.onclose = function (event) {
      live = false;
      mark("polling");
      if (event.code === 4403 || event.code === 4404) { return; }
      var delay = Math.min(MAX_DELAY_MS, 1000 * Math.pow(2, attempts));
      attempts += 1;
      setTimeout(open, Math.round(delay * (0.8 + Math.random() * 0.4)));
    };
  }

  open();
})();
