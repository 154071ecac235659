/*
 * The trajectory viewer and the review queue's keyboard.
 *
 *   j / k      next / previous step (opens nothing; o or Enter toggles it)
 *   o          open or close the current step
 *   x          flag the current step (review form)
 *   a          accept and submit (no reason needed)
 *   r / f      reject / needs fix: selects it and puts the cursor in the reason (Ctrl+Enter submits)
 *   n          skip: release this item and open the next one
 *   /          search this trajectory
 *   ?          show or hide this list
 */
(function () {
  "use strict";

  // j / k walk the trajectory's own steps; a sub-episode's steps (child-step) open with their parent's.
  var steps = Array.prototype.slice.call(document.querySelectorAll("details.step:not(.child-step)"));
  var allSteps = Array.prototype.slice.call(document.querySelectorAll("details.step"));
  var current = -1;

  function setCurrent(index) {
    if (!steps.length) { return; }
    index = Math.max(0, Math.min(steps.length - 1, index));
    if (current >= 0 && steps[current]) { steps[current].classList.remove("current"); }
    current = index;
    steps[current].classList.add("current");
    steps[current].scrollIntoView({ block: "nearest" });
    var label = document.querySelector("[data-current-step]");
    if (label) { label.textContent = "step " + (current + 1) + " of " + steps.length; }
  }

  // Search within the trajectory: steps whose text matches stay (opened), the others hide.
  var search = document.querySelector("[data-step-search]");
  var count = document.querySelector("[data-search-count]");
  if (search) {
    search.addEventListener("input", function () {
      var needle = search.value.trim().toLowerCase();
      var hits = 0;
      allSteps.forEach(function (step) {
        var match = !needle || step.textContent.toLowerCase().indexOf(needle) !== -1;
        step.hidden = !match;
        if (needle && match) { step.open = true; hits += 1; }
      });
      count.textContent = needle ? hits + " of " + allSteps.length + " steps match" : "";
    });
  }
  var expand = document.querySelector("[data-expand-all]");
  if (expand) {
    expand.addEventListener("click", function () {
      var open = expand.getAttribute("data-open") !== "true";
      allSteps.forEach(function (step) { step.open = open; });
      expand.setAttribute("data-open", open ? "true" : "false");
      expand.textContent = open ? "Collapse all" : "Expand all";
    });
  }

  var form = document.querySelector("form[data-verdict-form]");
  function choose(value, submit) {
    if (!form) { return; }
    var radio = form.querySelector("input[name=verdict][value=" + value + "]");
    if (!radio) { return; }
    radio.checked = true;
    if (submit) { form.requestSubmit(); return; }
    var reason = form.querySelector("textarea[name=reason]");
    if (reason) { reason.focus(); }
  }
  function flagCurrent() {
    if (!form || current < 0) { return; }
    var index = steps[current].getAttribute("data-step-index");
    // The flag boxes sit in the side panel, owned by the verdict form (form="verdict-form").
    var box = document.querySelector("input[name=flag][value='" + index + "']");
    if (!box) { return; }
    box.checked = !box.checked;
    steps[current].classList.toggle("flagged", box.checked);
    var flags = document.querySelector("details.flags");
    if (flags && box.checked) { flags.open = true; }
  }
  if (form) {
    form.addEventListener("keydown", function (event) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); form.requestSubmit(); }
    });
    document.querySelectorAll("input[name=flag]").forEach(function (box) {
      box.addEventListener("change", function () {
        var step = document.querySelector("details.step[data-step-index='" + box.value + "']");
        if (step) { step.classList.toggle("flagged", box.checked); }
      });
    });
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) { return; }
    var target = event.target;
    var typing = target && (target.tagName === "INPUT" || target.tagName === "TEXTAREA" || target.tagName === "SELECT" ||
                            target.isContentEditable);
    if (typing) {
      if (event.key === "Escape") { target.blur(); }
      return;
    }
    var handled = true;
    switch (event.key) {
      case "j": setCurrent(current + 1); break;
      case "k": setCurrent(current - 1); break;
      case "o": if (current >= 0) { steps[current].open = !steps[current].open; } break;
      case "x": flagCurrent(); break;
      case "a": choose("accept", true); break;
      case "r": choose("reject", false); break;
      case "f": choose("needs_fix", false); break;
      case "n": {
        var skip = document.querySelector("form[data-skip-form]");
        if (skip) { skip.requestSubmit(); } else { handled = false; }
        break;
      }
      case "/": if (search) { search.focus(); } else { handled = false; } break;
      case "?": {
        var help = document.querySelector("[data-keys-help]");
        if (help) { help.hidden = !help.hidden; } else { handled = false; }
        break;
      }
      default: handled = false;
    }
    if (handled) { event.preventDefault(); }
  });
})();
