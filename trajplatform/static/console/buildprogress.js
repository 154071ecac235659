/* A version build's page, live over /ws/version-builds/<id>/ (apps.datasets.consumers.
   VersionBuildConsumer): each message updates the status, stage and progress bar; a finished
   build opens its version. The socket reconnects with backoff; 4403 / 4404 end it. */
(function () {
  "use strict";
  var box = document.getElementById("build");
  if (!box || !box.getAttribute("data-ws")) { return; }
  var wsPath = box.getAttribute("data-ws");
  var attempts = 0, MAX_DELAY_MS = 30000, finished = false;

  function show(state) {
    box.setAttribute("data-status", state.status);
    document.getElementById("build-status").textContent = state.status;
    document.getElementById("build-status").className = "badge status-" + state.status;
    document.getElementById("build-stage").textContent = state.stage || "";
    document.getElementById("build-count").textContent = state.total ? state.done + " of " + state.total : "";
    var bar = document.getElementById("build-progress");
    bar.max = state.total || 1;
    bar.value = state.total ? state.done : 0;
    var error = document.getElementById("build-error");
    error.textContent = state.error || "";
    error.hidden = !state.error;
    if (state.version_url) {
      var link = document.getElementById("build-version");
      link.querySelector("a").setAttribute("href", state.version_url);
      link.hidden = false;
      box.setAttribute("data-version-url", state.version_url);
    }
    if (state.status === "done" || state.status === "failed") {
      finished = true;
      if (state.version_url) { window.location.assign(state.version_url); }
    }
  }

  function open() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(scheme + window.location.host + wsPath);
    ws.onopen = function () { attempts = 0; box.setAttribute("data-live-state", "live"); };
    ws.onmessage = function (event) {
      var message;
      try { message = JSON.parse(event.data); } catch (e) { return; }
      if (message && message.type === "build") { show(message); }
    };
    ws.onclose = function (event) {
      box.setAttribute("data-live-state", "closed");
      if (finished || event.code === 4403 || event.code === 4404) { return; }
      var delay = Math.min(MAX_DELAY_MS, 1000 * Math.pow(2, attempts));
      attempts += 1;
      setTimeout(open, Math.round(delay * (0.8 + Math.random() * 0.4)));
    };
  }

  if (box.getAttribute("data-status") === "done" && box.getAttribute("data-version-url")) { return; }
  if (box.getAttribute("data-status") === "failed") { return; }
  open();
})();
