// Trajectory report behaviour (inlined into trajectories.html by searchr1/report.py).
// Every piece of data is inserted with textContent, never as markup: model output
// contains information tags and arbitrary HTML.
(function () {
  "use strict";
  var rows = JSON.parse(document.getElementById("trajectory-data").textContent);
  var list = document.getElementById("trajectory-list");
  var controls = {
    source: document.getElementById("filter-source"),
    outcome: document.getElementById("filter-outcome"),
    q: document.getElementById("filter-text"),
  };
  var count = document.getElementById("visible-count");
  var items = [];

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function field(parent, label, value, cls) {
    if (value === undefined || value === null || value === "") return;
    var row = el("div", "field " + (cls || ""));
    row.appendChild(el("span", "label", label));
    row.appendChild(el("span", "value", value));
    parent.appendChild(row);
  }

  function fmt(x) {
    return typeof x === "number" ? (Math.round(x * 1000) / 1000).toString() : String(x);
  }

  function passage(doc, i) {
    var box = el("details", "passage");
    var title = "Doc " + (i + 1) + ": " + (doc.title || doc.id || "(untitled)");
    if (typeof doc.score === "number") title += "  (score " + fmt(doc.score) + ")";
    box.appendChild(el("summary", null, title));
    box.appendChild(el("pre", null, doc.text || ""));
    if (doc.url) field(box, "url", doc.url);
    if (doc.source) field(box, "source", doc.source);
    return box;
  }

  function turn(t, i) {
    var box = el("section", "turn action-" + (t.action || "none"));
    box.appendChild(el("h3", null, "Turn " + (i + 1) + " · " + (t.action || "?") +
      (t.stop_reason ? " · stop: " + t.stop_reason : "")));
    box.appendChild(el("pre", "model", t.text || ""));
    field(box, "query", t.query, "query");
    field(box, "answer", t.answer, "answer");
    field(box, "action error", t.action_error, "error");
    field(box, "tool error", t.tool_error, "error");
    (t.documents || []).forEach(function (d, j) { box.appendChild(passage(d, j)); });
    if (t.observation) {
      var obs = el("details", "observation");
      obs.appendChild(el("summary", null, "observation (" + t.observation.length + " chars)"));
      obs.appendChild(el("pre", null, t.observation));
      box.appendChild(obs);
    }
    return box;
  }

  function body(r) {
    var box = el("div", "body");
    (r.turns || []).forEach(function (t, i) { box.appendChild(turn(t, i)); });
    var end = el("section", "final");
    field(end, "answer", r.answer === null ? "(no answer)" : r.answer, "answer");
    field(end, "gold", (r.golden_answers || []).join(" | "), "gold");
    field(end, "reward", fmt(r.reward));
    field(end, "scores", JSON.stringify(r.scores || {}));
    field(end, "end reason", r.end_reason);
    field(end, "tokens", r.num_tokens);
    box.appendChild(end);
    return box;
  }

  function item(r) {
    var node = el("details", "traj " + (r._correct ? "correct" : "wrong"));
    var head = el("summary");
    head.appendChild(el("span", "badge", r._correct ? "✓" : "✗"));
    head.appendChild(el("span", "source", r._source));
    head.appendChild(el("span", "question", r.question));
    head.appendChild(el("span", "meta", r._searches + " search" + (r._searches === 1 ? "" : "es") +
      " · reward " + fmt(r.reward) + " · #" + (r.group_index || 0)));
    node.appendChild(head);
    node.addEventListener("toggle", function () {
      if (node.open && !node._built) { node.appendChild(body(r)); node._built = true; }
    });
    return node;
  }

  function text(r) {
    var parts = [r.question, r.answer, (r.golden_answers || []).join(" ")];
    (r.turns || []).forEach(function (t) { parts.push(t.query, t.text); });
    return parts.filter(Boolean).join("\n").toLowerCase();
  }

  function matches(r, f) {
    if (f.source !== "all" && r._source !== f.source) return false;
    if (f.outcome === "correct" && !r._correct) return false;
    if (f.outcome === "wrong" && r._correct) return false;
    if (f.outcome === "no-search" && r._searches !== 0) return false;
    return !f.q || text(r).indexOf(f.q.toLowerCase()) >= 0;
  }

  function readHash() {
    var p = new URLSearchParams(location.hash.replace(/^#/, ""));
    return { source: p.get("source") || "all", outcome: p.get("outcome") || "all",
             q: p.get("q") || "", expand: p.get("expand") === "all" };
  }

  function writeHash(f) {
    var p = new URLSearchParams();
    if (f.source !== "all") p.set("source", f.source);
    if (f.outcome !== "all") p.set("outcome", f.outcome);
    if (f.q) p.set("q", f.q);
    try { history.replaceState(null, "", "#" + p.toString()); } catch (e) { /* file:// quirks */ }
  }

  function select(control, value) {
    var known = Array.prototype.some.call(control.options, function (o) { return o.value === value; });
    if (!known) control.appendChild(el("option", null, value)).value = value;
    control.value = value;
  }

  function apply(f) {
    select(controls.source, f.source);
    select(controls.outcome, f.outcome);
    controls.q.value = f.q;
    var shown = 0;
    items.forEach(function (pair) {
      var visible = matches(pair.row, f);
      pair.node.hidden = !visible;
      if (visible) shown += 1;
      if (visible && f.expand) pair.node.open = true;
      if (pair.node.open && !pair.node._built) {
        pair.node.appendChild(body(pair.row)); pair.node._built = true;
      }
    });
    count.textContent = String(shown);
  }

  function current() {
    return { source: controls.source.value, outcome: controls.outcome.value,
             q: controls.q.value, expand: false };
  }

  rows.forEach(function (r) {
    var node = item(r);
    list.appendChild(node);
    items.push({ row: r, node: node });
  });
  ["change", "input"].forEach(function (kind) {
    Object.keys(controls).forEach(function (k) {
      controls[k].addEventListener(kind, function () { var f = current(); writeHash(f); apply(f); });
    });
  });
  window.addEventListener("hashchange", function () { apply(readHash()); });
  apply(readHash());
})();
