/*
 * Live log panel of the trajectory page (#live-log).
 *
 * 1. Backfill over HTTP: GET <data-backfill-url>?after=<seq> until `more` is false.
 * 2. Open the websocket at <data-ws-path> and send {"after": <seq>}: lines committed between
 *    the backfill and the subscribe come back in that reply.
 * 3. Append lines as they arrive, keyed by seq (duplicates dropped, out-of-order ones slotted
 *    in place). A jump in seq asks the server to re-send the gap.
 * 4. On a dropped connection, wait (1 s, 2 s, 4 s ... 30 s, with jitter), backfill from the last
 *    seq again and re-subscribe. Close codes 4403/4404 (refused) end the retries.
 *
 * Lines are written with textContent only: log text is never parsed as HTML.
 */
(function () {
  "use strict";

  var panel = document.getElementById("live-log");
  if (!panel) { return; }

  var BACKFILL_LIMIT = 1000;
  var MAX_DELAY_MS = 30000;
  var list = panel.querySelector("[data-log-lines]");
  var statusEl = panel.querySelector("[data-log-status]");
  var emptyNote = panel.querySelector("[data-log-empty]");
  var backfillUrl = panel.getAttribute("data-backfill-url");
  var wsPath = panel.getAttribute("data-ws-path");

  var bySeq = new Map();   // seq -> <li>
  var contiguous = 0;      // every seq in 1..contiguous is shown (or is known not to exist)
  var maxSeq = 0;
  var socket = null;
  var attempts = 0;
  var retryTimer = null;
  var resendPending = false;
  var stopped = false;

  function setState(state, text) {
    panel.setAttribute("data-state", state);
    statusEl.textContent = text;
  }

  function stop(state, text) {
    stopped = true;
    if (retryTimer) { clearTimeout(retryTimer); retryTimer = null; }
    setState(state, text);
  }

  function span(className, text) {
    var el = document.createElement("span");
    el.className = className;
    el.textContent = text;
    return el;
  }

  function render(line) {
    var li = document.createElement("li");
    li.setAttribute("data-seq", String(line.seq));
    li.className = "line kind-" + String(line.kind || "").replace(/[^a-z_-]/gi, "");
    if (line.created_at) { li.title = line.created_at; }
    li.appendChild(span("seq", String(line.seq)));
    li.appendChild(span("kind kind-" + String(line.kind || "").replace(/[^a-z_-]/gi, ""), String(line.kind || "")));
    li.appendChild(span("message", String(line.message == null ? "" : line.message)));
    var facts = summarize(line.data);
    if (facts) { li.appendChild(span("data", "  " + facts)); }
    return li;
  }

  // The short scalar facts of a line's data (exit code, duration...); long text in it repeats
  // the message, and the whole of it is in the backfill JSON.
  function summarize(data) {
    if (!data || typeof data !== "object" || Array.isArray(data)) { return ""; }
    return Object.keys(data).filter(function (key) {
      var value = data[key];
      if (key === "text" || key === "output") { return false; }
      if (typeof value === "string") { return value.length <= 60 && value.indexOf("\n") < 0; }
      return value === null || typeof value === "number" || typeof value === "boolean";
    }).map(function (key) {
      return key + "=" + (typeof data[key] === "string" ? data[key] : JSON.stringify(data[key]));
    }).join(" ");
  }

  function nearBottom() {
    return list.scrollHeight - list.scrollTop - list.clientHeight < 40;
  }

  // Merge lines into the panel; returns nothing. Keeps `contiguous` and `maxSeq` current.
  function merge(lines) {
    if (!Array.isArray(lines) || !lines.length) { return; }
    var follow = nearBottom();
    lines.forEach(function (line) {
      var seq = Number(line && line.seq);
      if (!Number.isInteger(seq) || seq < 1 || bySeq.has(seq)) { return; }
      var li = render(line);
      if (seq > maxSeq) {
        list.appendChild(li);
        maxSeq = seq;
      } else {
        // Rare: a gap being filled. Insert before the first shown line with a larger seq.
        var next = null;
        for (var s = seq + 1; s <= maxSeq; s++) {
          if (bySeq.has(s)) { next = bySeq.get(s); break; }
        }
        list.insertBefore(li, next);
      }
      bySeq.set(seq, li);
    });
    while (bySeq.has(contiguous + 1)) { contiguous += 1; }
    emptyNote.hidden = bySeq.size > 0;
    if (follow) { list.scrollTop = list.scrollHeight; }
  }

  function requestResend() {
    if (resendPending || !socket || socket.readyState !== WebSocket.OPEN) { return; }
    resendPending = true;
    socket.send(JSON.stringify({ after: contiguous }));
  }

  // Backfill everything after `contiguous`; resolves when caught up, rejects on failure.
  function backfill() {
    var url = backfillUrl + "?after=" + contiguous + "&limit=" + BACKFILL_LIMIT;
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (response) {
        if (response.status === 403) {
          stop("signed-out", "not allowed: sign in again and reload");
          throw new Error("403");
        }
        if (response.status === 404) { stop("refused", "trajectory not found"); throw new Error("404"); }
        if (!response.ok) { throw new Error("backfill HTTP " + response.status); }
        return response.json();
      })
      .then(function (body) {
        merge(body.lines);
        // The reply covers every line after `after` up to last_seq: a seq missing there is gone.
        contiguous = Math.max(contiguous, Number(body.last_seq) || 0);
        while (bySeq.has(contiguous + 1)) { contiguous += 1; }
        if (body.more) { return backfill(); }
        return undefined;
      });
  }

  function onMessage(event) {
    var message;
    try { message = JSON.parse(event.data); } catch (e) { return; }
    if (!message || message.type !== "lines") { return; }
    var lines = Array.isArray(message.lines) ? message.lines : [];
    merge(lines);
    if (typeof message.after === "number") {
      // Reply to a resend: authoritative for the range it covers.
      resendPending = false;
      if (lines.length) { contiguous = Math.max(contiguous, Number(lines[lines.length - 1].seq)); }
      while (bySeq.has(contiguous + 1)) { contiguous += 1; }
      if (message.more) { requestResend(); }
    } else if (maxSeq > contiguous) {
      requestResend();  // a live message skipped some seq: fetch the gap
    }
  }

  function openSocket() {
    var scheme = window.location.protocol === "https:" ? "wss://" : "ws://";
    var ws = new WebSocket(scheme + window.location.host + wsPath);
    socket = ws;
    resendPending = false;
    ws.onopen = function () {
      attempts = 0;
      setState("live", "live");
      requestResend();
    };
    ws.onmessage = onMessage;
    ws.onclose = function (event) {
      if (socket !== ws) { return; }
      socket = null;
      if (event.code === 4403) { stop("refused", "not allowed to follow this log"); return; }
      if (event.code === 4404) { stop("refused", "trajectory not found"); return; }
      scheduleReconnect();
    };
  }

  function scheduleReconnect() {
    if (stopped || retryTimer) { return; }
    var delay = Math.min(MAX_DELAY_MS, 1000 * Math.pow(2, attempts));
    delay = Math.round(delay * (0.8 + Math.random() * 0.4));
    attempts += 1;
    setState("reconnecting", "disconnected; retrying in " + Math.ceil(delay / 1000) + " s");
    retryTimer = setTimeout(function () {
      retryTimer = null;
      start();
    }, delay);
  }

  function start() {
    if (stopped) { return; }
    setState("connecting", attempts ? "reconnecting…" : "loading…");
    // A finished trajectory's log is complete: read it once, never claim to follow it live.
    var onBackfilled = panel.getAttribute("data-final") === "true"
      ? function () { stop("finished", "finished: the complete log"); }
      : openSocket;
    backfill().then(onBackfilled, function () { scheduleReconnect(); });
  }

  start();
})();
