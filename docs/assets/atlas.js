// The atlas grid (docs/gen/atlas_pages.py renders it as a plain Markdown table after the
// #atlas-grid marker): filters by implementation and question, a "deviations only" toggle,
// sorting by any column, and a dialog that shows a cell's reproducer, read from the
// implementation's entry page (<pre id="repro-QUESTION">). Without JavaScript the table and its
// links work as they are. No framework, nothing loaded from elsewhere.
(function () {
  "use strict";

  var DIFFERS = { deviates: true, undeclared: true };
  var snippets = {}; // entry page URL -> Promise of its Document

  function gridTable(marker) {
    for (var el = marker.nextElementSibling; el; el = el.nextElementSibling) {
      if (el.tagName === "TABLE") return el;
      var t = el.querySelector && el.querySelector("table");
      if (t) return t;
    }
    return null;
  }

  function make(tag, attrs, text) {
    var el = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { el.setAttribute(k, attrs[k]); });
    if (text) el.textContent = text;
    return el;
  }

  function cellStatus(td) {
    var s = td && td.querySelector("[data-status]");
    return s ? s.getAttribute("data-status") : "";
  }

  function init() {
    var marker = document.getElementById("atlas-grid");
    if (!marker || marker.getAttribute("data-ready")) return;
    var table = gridTable(marker);
    if (!table || !table.tBodies.length) return;
    marker.setAttribute("data-ready", "1");
    table.classList.add("atlas-table");
    var headers = Array.prototype.slice.call(table.tHead.rows[0].cells);
    var body = table.tBodies[0];
    var all = Array.prototype.slice.call(body.rows);
    var specRow = all[0]; // the spec's answers stay first, whatever the filter or the order
    specRow.classList.add("atlas-spec-answers");
    var rows = all.slice(1);
    var lastCol = headers.length - 1; // the suite's verdict

    // -- controls --------------------------------------------------------------------------
    var bar = make("div", { class: "atlas-controls", role: "search" });
    var impl = make("input", { type: "search", id: "atlas-filter-impl", placeholder: "implementation…",
      "aria-label": "Filter by implementation" });
    var question = make("select", { id: "atlas-filter-question", "aria-label": "Show one question" });
    question.appendChild(make("option", { value: "" }, "every question"));
    headers.forEach(function (th, i) {
      if (i > 0 && i < lastCol) question.appendChild(make("option", { value: String(i) }, th.textContent.trim()));
    });
    var devLabel = make("label", { class: "atlas-toggle" });
    var devOnly = make("input", { type: "checkbox", id: "atlas-deviations-only" });
    devLabel.appendChild(devOnly);
    devLabel.appendChild(document.createTextNode(" deviations only"));
    var count = make("span", { class: "atlas-count", "aria-live": "polite", id: "atlas-count" });
    [impl, question, devLabel, count].forEach(function (el) { bar.appendChild(el); });
    marker.appendChild(bar);

    function apply() {
      var needle = impl.value.trim().toLowerCase();
      var col = question.value ? Number(question.value) : 0;
      headers.forEach(function (th, i) {
        var hide = col && i > 0 && i < lastCol && i !== col;
        th.hidden = hide;
        all.forEach(function (tr) { if (tr.cells[i]) tr.cells[i].hidden = hide; });
      });
      var shown = 0;
      rows.forEach(function (tr) {
        var name = tr.cells[0].textContent.toLowerCase();
        var ok = !needle || name.indexOf(needle) >= 0;
        if (ok && devOnly.checked) {
          ok = false;
          for (var i = 1; i < lastCol; i++) {
            if ((!col || i === col) && DIFFERS[cellStatus(tr.cells[i])]) { ok = true; break; }
          }
        }
        tr.hidden = !ok;
        if (ok) shown++;
      });
      count.textContent = shown + " of " + rows.length + " implementations";
    }
    [impl, question, devOnly].forEach(function (el) {
      el.addEventListener("input", apply);
      el.addEventListener("change", apply);
    });

    // -- sorting -----------------------------------------------------------------------------
    headers.forEach(function (th, i) {
      var button = make("button", { type: "button", class: "atlas-sort", title: "Sort by this column" });
      while (th.firstChild) button.appendChild(th.firstChild);
      th.appendChild(button);
      th.setAttribute("aria-sort", "none");
      button.addEventListener("click", function () {
        var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
        headers.forEach(function (h) { h.setAttribute("aria-sort", "none"); });
        th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
        var key = function (tr) {
          var td = tr.cells[i];
          // deviating answers sort together, before the others, within a question's column
          var rank = i > 0 && i < lastCol ? (DIFFERS[cellStatus(td)] ? "0" : "1") : "";
          return rank + td.textContent.trim().toLowerCase();
        };
        rows.sort(function (a, b) { return dir * key(a).localeCompare(key(b)); });
        rows.forEach(function (tr) { body.appendChild(tr); });
      });
    });

    // -- reproducer dialog ------------------------------------------------------------------
    var dialog = make("dialog", { class: "atlas-dialog", id: "atlas-dialog", "aria-labelledby": "atlas-dialog-title" });
    var title = make("h2", { id: "atlas-dialog-title" });
    var answer = make("p", { class: "atlas-dialog-answer" });
    var pre = make("pre", { class: "atlas-dialog-code" });
    var code = make("code");
    pre.appendChild(code);
    var actions = make("div", { class: "atlas-dialog-actions" });
    var copy = make("button", { type: "button" }, "Copy");
    var open = make("a", {}, "Open on its page");
    var close = make("button", { type: "button", class: "atlas-close" }, "Close");
    [copy, open, close].forEach(function (el) { actions.appendChild(el); });
    [title, answer, actions, pre].forEach(function (el) { dialog.appendChild(el); });
    document.body.appendChild(dialog);
    close.addEventListener("click", function () { dialog.close(); });
    dialog.addEventListener("click", function (e) { if (e.target === dialog) dialog.close(); });
    copy.addEventListener("click", function () {
      if (navigator.clipboard) navigator.clipboard.writeText(code.textContent).then(function () {
        copy.textContent = "Copied";
        setTimeout(function () { copy.textContent = "Copy"; }, 1500);
      });
    });

    function fetchDoc(url) {
      if (!snippets[url]) {
        snippets[url] = fetch(url).then(function (r) {
          if (!r.ok) throw new Error(r.status + " " + url);
          return r.text();
        }).then(function (text) { return new DOMParser().parseFromString(text, "text/html"); });
      }
      return snippets[url];
    }

    table.addEventListener("click", function (e) {
      var link = e.target.closest && e.target.closest("a");
      if (!link || !link.querySelector(".atlas-repro-link")) return;
      var url = link.href.split("#")[0], id = decodeURIComponent(link.hash.slice(1));
      var cell = link.closest("td");
      var col = Array.prototype.indexOf.call(cell.parentNode.cells, cell);
      e.preventDefault();
      title.textContent = cell.parentNode.cells[0].textContent.trim() + ": " + headers[col].textContent.trim();
      var said = cell.querySelector("[data-status]");
      answer.textContent = said ? "Answered " + said.getAttribute("title").split(": ").slice(1).join(": ") : "";
      code.textContent = "loading…";
      open.href = link.href;
      if (!dialog.open) dialog.showModal();
      fetchDoc(url).then(function (doc) {
        var el = doc.getElementById(id);
        if (!el) throw new Error("no #" + id + " on " + url);
        code.textContent = el.textContent;
      }).catch(function () {
        window.location.href = link.href; // the page itself still shows it
      });
    });

    apply();
  }

  // Material's instant loading swaps pages without a load event: follow its document$ if present
  if (window.document$ && typeof window.document$.subscribe === "function") {
    window.document$.subscribe(init);
  } else if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
