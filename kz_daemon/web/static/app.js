// Small progressive enhancements; every page works without this file.
(function () {
  "use strict";
  // Click a header of a table.sortable to sort its rows in the browser.
  function cellValue(row, index) {
    var cell = row.children[index];
    var raw = cell ? (cell.getAttribute("data-value") || cell.textContent) : "";
    var num = parseFloat(raw);
    return isNaN(num) ? raw.toLowerCase() : num;
  }
  document.querySelectorAll("table.sortable th").forEach(function (th, index) {
    th.style.cursor = "pointer";
    th.addEventListener("click", function (event) {
      if (event.target.tagName === "A") { event.preventDefault(); }
      var table = th.closest("table");
      var body = table.tBodies[0];
      var asc = th.getAttribute("data-order") !== "asc";
      table.querySelectorAll("th").forEach(function (x) { x.removeAttribute("data-order"); });
      th.setAttribute("data-order", asc ? "asc" : "desc");
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = cellValue(a, index), y = cellValue(b, index);
        if (x === "" && y !== "") { return 1; }
        if (y === "" && x !== "") { return -1; }
        return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  // A submission page follows its status with the long poll and reloads on a change.
  var live = document.querySelector("[data-status-url]");
  if (live) {
    var url = live.getAttribute("data-status-url");
    var current = live.getAttribute("data-status");
    var follow = function () {
      fetch(url + "?wait=25", {headers: {"Accept": "application/json"}})
        .then(function (r) { return r.json(); })
        .then(function (doc) {
          if (doc.status && doc.status !== current) { window.location.reload(); return; }
          if (!doc.terminal) { follow(); }
        })
        .catch(function () { setTimeout(follow, 3000); });
    };
    follow();
  }
})();
