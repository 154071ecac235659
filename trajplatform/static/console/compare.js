/*
 * The aligned comparison's keyboard (templates/reviews/compare.html).
 *
 *   a / b      A is better / B is better (stored as a preference, with the reason typed)
 *   t / s      a tie / skip (nothing stored); each then opens the batch's next task to compare
 *   /          type the reason (Enter sends nothing by itself: pick a, b, t or s after Esc)
 *   j / k      next / previous row where the rollouts differ
 */
(function () {
  "use strict";

  var form = document.querySelector("form[data-prefer-form]");
  var note = document.getElementById("prefer-note");
  var rows = Array.prototype.slice.call(document.querySelectorAll("#aligned tr.diverged"));
  var current = -1;

  function decide(value) {
    if (!form) { return false; }
    var button = form.querySelector("button[name=decision][value=" + value + "]");
    if (!button) { return false; }
    form.requestSubmit(button);
    return true;
  }
  function move(delta) {
    if (!rows.length) { return; }
    if (current >= 0) { rows[current].classList.remove("current"); }
    current = Math.max(0, Math.min(rows.length - 1, current + delta));
    rows[current].classList.add("current");
    rows[current].scrollIntoView({ block: "center" });
  }
  if (note) {
    // Enter in the reason must not send the first button's decision (A) by accident.
    note.addEventListener("keydown", function (event) {
      if (event.key === "Enter") { event.preventDefault(); note.blur(); }
    });
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) { return; }
    var target = event.target;
    if (target && (target.tagName === "INPUT" || target.tagName === "TEXTAREA" || target.tagName === "SELECT" ||
                   target.isContentEditable)) {
      if (event.key === "Escape") { target.blur(); }
      return;
    }
    var handled = true;
    switch (event.key) {
      case "a": handled = decide("a"); break;
      case "b": handled = decide("b"); break;
      case "t": handled = decide("tie"); break;
      case "s": handled = decide("skip"); break;
      case "/": if (note) { note.focus(); } else { handled = false; } break;
      case "j": move(1); break;
      case "k": move(-1); break;
      default: handled = false;
    }
    if (handled) { event.preventDefault(); }
  });
})();
