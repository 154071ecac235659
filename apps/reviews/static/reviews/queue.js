// The review queue's bulk selection: "select all" for the page's rows and a count of the selected.
(function () {
  "use strict";
  var form = document.getElementById("bulk");
  if (!form) return;
  var all = document.getElementById("select-all");
  var count = document.getElementById("bulk-count");
  var boxes = function () { return document.querySelectorAll('input[name="item"][form="bulk"]'); };
  var update = function () {
    var n = 0;
    boxes().forEach(function (box) { if (box.checked) n += 1; });
    count.textContent = "Selected: " + n;
    if (all) { all.checked = n > 0 && n === boxes().length; all.indeterminate = n > 0 && n < boxes().length; }
  };
  if (all) {
    all.addEventListener("change", function () {
      boxes().forEach(function (box) { box.checked = all.checked; });
      update();
    });
  }
  document.addEventListener("change", function (event) {
    if (event.target.matches && event.target.matches('input[name="item"]')) update();
  });
  update();
})();
