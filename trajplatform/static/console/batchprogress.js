/* The batch page's progress line, live over /ws/batches/<id>/ (apps.tasks.consumers.
   BatchProgressConsumer). While the socket is open the line's 3 s htmx polling pauses (its
   trigger asks window.batchProgressLive()); when it closes the polling takes over again and
   the socket reconnects with backoff. 4403 / 4404 end it: the polling stays. */
(function () {
  "use strict";
  var line = document.getElementById("batch-progress");
  if (!line || !line.getAttribute("data-ws")) { return; }
  var wsPath = line.getAttribute("data-ws");
  var live = false, attempts = 0, MAX_DELAY_MS = 30000;
  window.batchProgressLive = function () { return live; };

  function render(message) {
    var el = document.getElementById("batch-progress");  // htmx may have swapped it
    if (!el) { return; }
    var total = message.total, final = message.final;
    var bar = el.querySelector(".bar > span");
    if (bar) { bar.style.width = (total ? Math.round(100 * final / total) : 0) + "%"; }
    var finalText = el.querySelector("[data-final]");
    if (finalText) { finalText.textContent = final + " of " + total + " tasks final"; }
    var counts = el.querySelector("[data-counts]");
    if (counts) {
      var parts = [];
      var labels = message.labels || {};
      Object.keys(message.counts).forEach(function (k) {
        if (message.counts[k]) { parts.push(message.counts[k] + " " + (labels[k] || k)); }
      });
      counts.textContent = parts.length ? parts.join(" · ") + " · " : "";
    }
    var state = el.querySelector("[data-live]");
    if (state) { state.textContent = final < total ? "· live" : "· all final"; }
    el.setAttribute("data-live-state", "live");
  }

  function open() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(scheme + window.location.host + wsPath);
    ws.onopen = function () { live = true; attempts = 0; };
    ws.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (message && message.type === "progress") { render(message); }
    };
    ws.onclose = function (event) {
      live = false;
      var el = document.getElementById("batch-progress");
      if (el) { el.setAttribute("data-live-state", "polling"); }
      if (event.code === 4403 || event.code === 4404) { return; }
      var delay = Math.min(MAX_DELAY_MS, 1000 * Math.pow(2, attempts));
      attempts += 1;
      setTimeout(open, Math.round(delay * (0.8 + Math.random() * 0.4)));
    };
  }

  open();
})();
