// OpenRelay Batch dashboard: live batch updates over a websocket, the
// records-over-time chart, drag-and-drop upload and confirmations.
// Plain browser JavaScript, no build step. The server renders every page
// complete; this script only keeps it current. Values are formatted the way
// batches/dashboard_views.py `display` formats them.
"use strict";

(function () {
  const TERMINAL = new Set(["completed", "failed", "expired", "cancelled"]);
  const CANCELLABLE = new Set(["validating", "in_progress"]);
  const RANK = { validating: 0, in_progress: 1, finalizing: 2, cancelling: 2, completed: 3, failed: 3, expired: 3, cancelled: 3 };
  const body = document.body;

  // ---------------------------------------------------------------- format

  function int(n) {
    return (n || 0).toLocaleString("en-US");
  }

  function money(amount, currency) {
    if (amount === undefined || amount === null) return "\u2014";
    const n = Number(amount);
    if (!Number.isFinite(n)) return "\u2014";
    const text = n.toFixed(6).replace(/0{1,4}$/, "");
    const cur = (currency || "usd").toLowerCase();
    return cur === "usd" ? "$" + text : text + " " + cur.toUpperCase();
  }

  function when(unix) {
    if (unix === undefined || unix === null) return "";
    return new Date(unix * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  function percent(done, total, status) {
    if (total <= 0) return TERMINAL.has(status) ? 100 : 0;
    return Math.min(100, Math.floor((done * 100) / total));
  }

  function display(batch) {
    const counts = batch.request_counts;
    const done = counts.completed + counts.failed;
    const usage = batch.usage || {};
    const cost = usage.cost || {};
    const cur = cost.currency;
    return {
      id: batch.id,
      endpoint: batch.endpoint,
      model: batch.model || "",
      status: batch.status,
      percent: percent(done, counts.total, batch.status) + "%",
      counts: int(done) + " / " + int(counts.total),
      completed: int(counts.completed),
      failed: int(counts.failed),
      tokens: int(usage.total_tokens),
      input_tokens: int(usage.input_tokens),
      cached_tokens: int((usage.input_tokens_details || {}).cached_tokens),
      output_tokens: int(usage.output_tokens),
      reasoning_tokens: int((usage.output_tokens_details || {}).reasoning_tokens),
      cost: money(cost.total, cur),
      cost_input: money(cost.input, cur),
      cost_cached_input: money(cost.cached_input, cur),
      cost_output: money(cost.output, cur),
      created: when(batch.created_at),
    };
  }

  function progress(batch) {
    const c = batch.request_counts;
    return [RANK[batch.status] || 0, c.completed + c.failed, (batch.usage || {}).total_tokens || 0];
  }

  function older(a, b) {
    for (let i = 0; i < a.length; i++) {
      if (a[i] !== b[i]) return a[i] < b[i];
    }
    return false;
  }

  function url(template, placeholder, id) {
    return template.replace(placeholder, encodeURIComponent(id));
  }

  // ---------------------------------------------------------------- apply

  const last = new Map();

  function apply(batch) {
    const seen = last.get(batch.id);
    const now = progress(batch);
    if (seen && older(now, seen)) return; // two workers' events may cross
    last.set(batch.id, now);
    let el = document.querySelector('[data-batch="' + CSS.escape(batch.id) + '"]');
    if (!el) el = insertRow(batch);
    if (!el) return;
    const shown = display(batch);
    el.dataset.status = batch.status;
    el.querySelectorAll("[data-field]").forEach(function (node) {
      const name = node.dataset.field;
      if (name === "bar") {
        node.style.width = shown.percent;
        node.parentElement.setAttribute("aria-valuenow", parseInt(shown.percent, 10));
      } else if (name === "link") {
        node.href = url(body.dataset.batchUrl, "BATCH_ID", batch.id);
      } else if (name.endsWith("_at")) {
        node.textContent = when(batch[name]);
      } else if (name in shown) {
        node.textContent = shown[name];
      }
    });
    el.querySelectorAll("[data-ts]").forEach(function (node) {
      node.hidden = !batch[node.dataset.ts];
    });
    el.querySelectorAll("[data-file]").forEach(function (node) {
      const id = batch[node.dataset.file];
      if (id) {
        node.href = url(body.dataset.downloadUrl, "FILE_ID", id);
        node.hidden = false;
      }
    });
    el.querySelectorAll("[data-files-pending]").forEach(function (node) {
      node.hidden = TERMINAL.has(batch.status);
    });
    el.querySelectorAll('[data-role="cancel"]').forEach(function (node) {
      node.hidden = !CANCELLABLE.has(batch.status);
    });
    if (chart && el.contains(chart.svg)) chart.add(batch);
  }

  function insertRow(batch) {
    const rows = document.querySelector("[data-rows]");
    const template = document.getElementById("batch-row");
    if (!rows || !template || !("insertNew" in body.dataset)) return null;
    const row = template.content.firstElementChild.cloneNode(true);
    row.dataset.batch = batch.id;
    rows.querySelectorAll("[data-empty]").forEach(function (node) { node.remove(); });
    rows.prepend(row);
    return row;
  }

  // ---------------------------------------------------------------- chart

  // Records completed (request_counts.completed) against time, from the
  // snapshots this page received; seeded with the start and the state when
  // it was rendered.
  function Chart(svg, seed, skew) {
    this.svg = svg;
    this.line = svg.querySelector("[data-chart-line]");
    this.max = svg.querySelector("[data-chart-max]");
    this.span = svg.querySelector("[data-chart-span]");
    this.skew = skew;
    this.points = [];
    this.total = seed.request_counts.total;
    if (seed.in_progress_at) this.points.push({ t: seed.in_progress_at, done: 0 });
    const end = seed.completed_at || seed.cancelled_at || seed.expired_at || seed.failed_at || seed.finalizing_at;
    this.push(end || Date.now() / 1000 - skew, seed);
    this.draw();
  }

  Chart.prototype.push = function (t, batch) {
    const done = batch.request_counts.completed;
    const previous = this.points[this.points.length - 1];
    if (previous && previous.done === done && !TERMINAL.has(batch.status)) return;
    this.points.push({ t: Math.max(t, previous ? previous.t : t), done: done });
    if (this.points.length > 600) this.points.splice(1, 1);
  };

  Chart.prototype.add = function (batch) {
    this.total = batch.request_counts.total;
    this.push(Date.now() / 1000 - this.skew, batch);
    this.draw();
  };

  Chart.prototype.draw = function () {
    const pts = this.points;
    this.svg.dataset.points = pts.length;
    if (!pts.length) return;
    const t0 = pts[0].t;
    const t1 = Math.max(pts[pts.length - 1].t, t0 + 1);
    const top = Math.max(this.total, 1);
    this.line.setAttribute("points", pts.map(function (p) {
      const x = 48 + ((p.t - t0) / (t1 - t0)) * 902; // the axes drawn in batch.html's viewBox
      const y = 172 - (p.done / top) * 160;
      return x.toFixed(1) + "," + y.toFixed(1);
    }).join(" "));
    this.max.textContent = int(this.total);
    const seconds = Math.round(t1 - t0);
    this.span.textContent = seconds < 120 ? seconds + " s" : Math.round(seconds / 60) + " min";
  };

  let chart = null;
  const chartSvg = document.querySelector("[data-chart]");
  const seedNode = document.getElementById("batch-data");
  if (chartSvg && seedNode) {
    const seed = JSON.parse(seedNode.textContent);
    const article = chartSvg.closest("[data-server-now]");
    const skew = article ? Date.now() / 1000 - Number(article.dataset.serverNow) : 0;
    chart = new Chart(chartSvg, seed, skew);
    last.set(seed.id, progress(seed));
  }

  // ---------------------------------------------------------------- socket

  const live = document.querySelector("[data-live]");

  function setLive(state) {
    body.dataset.socketState = state;
    if (!live) return;
    live.hidden = false;
    live.className = "live " + state;
    live.textContent = { open: "\u25CF live", connecting: "connecting\u2026", closed: "reconnecting\u2026" }[state];
  }

  function connect(path, attempt) {
    setLive("connecting");
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(scheme + "//" + location.host + path);
    socket.onopen = function () {
      attempt = 0;
      setLive("open");
    };
    socket.onmessage = function (event) {
      let message;
      try {
        message = JSON.parse(event.data);
      } catch (err) {
        return;
      }
      if (message.type === "batch.updated" && message.batch) apply(message.batch);
    };
    socket.onclose = function () {
      // Snapshots are absolute: after a reconnect the first one catches up.
      setLive("closed");
      setTimeout(function () { connect(path, attempt + 1); }, Math.min(10000, 500 * Math.pow(2, attempt)));
    };
  }

  if (body.dataset.socket) connect(body.dataset.socket, 0);

  // ---------------------------------------------------------------- forms

  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });

  document.querySelectorAll("[data-drop]").forEach(function (zone) {
    const input = zone.querySelector("[data-file-input]");
    const name = zone.querySelector("[data-file-name]");
    function show() {
      const file = input.files[0];
      if (file) {
        name.textContent = file.name + " \u00B7 " + int(file.size) + " bytes";
        zone.classList.add("chosen");
      }
    }
    input.addEventListener("change", show);
    ["dragenter", "dragover"].forEach(function (type) {
      zone.addEventListener(type, function (event) {
        event.preventDefault();
        zone.classList.add("over");
      });
    });
    ["dragleave", "drop"].forEach(function (type) {
      zone.addEventListener(type, function () { zone.classList.remove("over"); });
    });
    zone.addEventListener("drop", function (event) {
      event.preventDefault();
      if (event.dataTransfer && event.dataTransfer.files.length) {
        input.files = event.dataTransfer.files;
        show();
      }
    });
  });

  document.querySelectorAll("form[data-new-batch]").forEach(function (form) {
    form.addEventListener("submit", function () {
      const button = form.querySelector("[data-submit]");
      button.disabled = true;
      button.textContent = "Uploading and checking every record\u2026";
    });
  });
})();
