// OpenRelay Batch dashboard: live batch updates over a websocket, the
// records-over-time chart, drag-and-drop upload and confirmations.
// Plain browser JavaScript, no build step. The server renders every page
// complete; this script only keeps it current, writing the values the server
// formatted (batches/dashboard/display.py), except the chart's own.
"use strict";

(function () {
  const TERMINAL = new Set(["completed", "failed", "expired", "cancelled"]);
  const CANCELLABLE = new Set(["validating", "in_progress"]);
  const RETRYABLE = new Set(["completed", "expired", "cancelled"]);
  const RANK = { validating: 0, in_progress: 1, finalizing: 2, cancelling: 2, completed: 3, failed: 3, expired: 3, cancelled: 3 };
  const body = document.body;

  // ---------------------------------------------------------------- format

  // The server writes every value a push shows (message.fields, batches/dashboard/display.py
  // `live_fields`); only the chart formats here, because its rate, time left and axis move
  // every second between pushes.
  function int(n) {
    return (n || 0).toLocaleString("en-US");
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "\u2014";
    seconds = Math.max(0, Math.round(seconds));
    if (seconds < 60) return seconds + " s";
    const minutes = Math.floor(seconds / 60);
    if (minutes < 60) return minutes + " min " + String(seconds % 60).padStart(2, "0") + " s";
    return Math.floor(minutes / 60) + " h " + String(minutes % 60).padStart(2, "0") + " min";
  }

  function rateText(rate) {
    return rate === null || rate === undefined ? "\u2014" : rate.toLocaleString("en-US", { minimumFractionDigits: 1, maximumFractionDigits: 1 }) + "/s";
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

  // message: the socket's {batch, fields, not_run?, failures?}.
  function apply(batch, message) {
    message = message || {};
    const seen = last.get(batch.id);
    const now = progress(batch);
    if (seen && older(now, seen)) return; // two workers' events may cross
    last.set(batch.id, now);
    let el = document.querySelector('[data-batch="' + CSS.escape(batch.id) + '"]');
    if (!el) el = insertRow(batch);
    if (!el) return;
    if (typeof message.not_run === "number") el.dataset.notRunCount = message.not_run;
    const notRun = Number(el.dataset.notRunCount || 0);
    const shown = Object.assign({}, message.fields);
    const failed = batch.request_counts.failed - notRun;
    if (chart && el.contains(chart.svg)) {
      chart.add(batch, notRun);
      Object.assign(shown, chart.pace(batch));
    }
    el.dataset.status = batch.status;
    el.querySelectorAll("[data-field]").forEach(function (node) {
      const name = node.dataset.field;
      if (name === "bar" || name === "bar_failed" || name === "bar_not_run") {
        node.style.width = shown[name];
        node.parentElement.setAttribute("aria-valuenow", parseInt(shown.percent, 10));
      } else if (name === "link") {
        node.href = url(body.dataset.batchUrl, "BATCH_ID", batch.id);
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
    // Guardrails: the pause banner and badge, and which of pause and resume is offered.
    const paused = (batch.openrelay || {}).paused || null;
    el.querySelectorAll("[data-paused]").forEach(function (node) { node.hidden = !paused; });
    el.querySelectorAll('[data-role="pause"]').forEach(function (node) {
      node.hidden = Boolean(paused) || !CANCELLABLE.has(batch.status);
    });
    el.querySelectorAll('[data-role="resume"]').forEach(function (node) { node.hidden = !paused; });
    if (paused) {
      el.querySelectorAll('[data-field="paused_reason"]').forEach(function (node) { node.textContent = paused.reason; });
      el.querySelectorAll('[data-field="paused_message"]').forEach(function (node) {
        node.textContent = paused.message || "";
      });
    }
    el.querySelectorAll('[data-role="retry"]').forEach(function (node) {
      node.hidden = !(RETRYABLE.has(batch.status) && batch.request_counts.failed > 0);
    });
    el.querySelectorAll("[data-not-run]").forEach(function (node) {
      node.hidden = notRun <= 0;
    });
    // The failures card's badges show the tiles' own figures; the socket sends a snapshot that
    // moves them only with the card read as of the same moment (consumers.BatchConsumer).
    el.querySelectorAll("[data-badge]").forEach(function (node) {
      node.hidden = (node.dataset.badge === "failed" ? failed : notRun) <= 0;
    });
    if (typeof message.failures === "string") {
      el.querySelectorAll("[data-failures]").forEach(function (node) { node.innerHTML = message.failures; });
    }
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

  // ---------------------------------------------------------------- chart and pace

  // Records completed and failed against time: the samples the engines stored
  // as the batch ran (rendered into the page, starting at in_progress_at with
  // nothing done), then one point per pushed snapshot. The axis runs from the
  // start to the finish, or to now while the batch runs. Rate and time left are
  // read from the same points, the way batches/progress.py reads the samples.
  const RATE_WINDOW_S = 60;
  const END_FIELDS = ["completed_at", "cancelled_at", "expired_at", "failed_at"];

  function endOf(batch) {
    for (const name of END_FIELDS) if (batch[name]) return batch[name];
    return null;
  }

  function Chart(svg, seed, samples, skew) {
    this.svg = svg;
    this.line = svg.querySelector("[data-chart-line]");
    this.failedLine = svg.querySelector("[data-chart-failed]");
    this.max = svg.querySelector("[data-chart-max]");
    this.startLabel = svg.querySelector("[data-chart-start]");
    this.endLabel = svg.querySelector("[data-chart-end]");
    this.span = svg.querySelector("[data-chart-span]");
    this.skew = skew;
    this.points = samples.map(function (s) { return { t: s[0], completed: s[1], failed: s[2] }; });
    this.total = seed.request_counts.total;
    this.start = seed.in_progress_at;
    this.end = endOf(seed);
    if (!this.end) this.push(this.now(), seed, Number(svg.closest("[data-not-run-count]").dataset.notRunCount || 0));
    this.draw();
  }

  Chart.prototype.now = function () {
    return Date.now() / 1000 - this.skew;
  };

  Chart.prototype.push = function (t, batch, notRun) {
    const c = batch.request_counts;
    const point = { t: t, completed: c.completed, failed: c.failed - (notRun || 0) };
    const previous = this.points[this.points.length - 1];
    if (previous && point.t <= previous.t) {
      // A finish at a whole second may be before the last live point: that point is the finish.
      if (previous.completed + previous.failed <= point.completed + point.failed) this.points[this.points.length - 1] = Object.assign(point, { t: previous.t });
      return;
    }
    if (previous && previous.completed === point.completed && previous.failed === point.failed) {
      const before = this.points[this.points.length - 2];
      if (before && before.completed === point.completed && before.failed === point.failed) {
        previous.t = t; // a flat stretch: one point at each end is enough
        return;
      }
    }
    this.points.push(point);
    if (this.points.length > 2000) this.points.splice(1, 1);
  };

  Chart.prototype.add = function (batch, notRun) {
    this.total = batch.request_counts.total;
    if (batch.in_progress_at && !this.start) {
      this.start = batch.in_progress_at;
      if (!this.points.length) this.points.push({ t: this.start, completed: 0, failed: 0 });
    }
    if (this.end) return;
    const end = endOf(batch);
    if (end) {
      this.end = end;
      this.points = this.points.filter(function (p) { return p.t < end; });
    }
    this.push(end || this.now(), batch, notRun);
    this.draw();
  };

  // Records a second over the last minute up to now (0 after a stall), and the time left
  // at that rate; once finished, the average rate and the time the batch took.
  Chart.prototype.pace = function (batch) {
    const c = batch.request_counts;
    if (this.end) {
      const last = this.points[this.points.length - 1];
      const took = this.start ? this.end - this.start : null;
      const done = last ? last.completed + last.failed : 0;
      return { rate: rateText(took ? done / took : null), eta_label: "Took", eta: duration(took) };
    }
    const now = this.now();
    const done = c.completed + c.failed;
    let start = this.points[0];
    for (const p of this.points) {
      if (p.t > now - RATE_WINDOW_S) break;
      start = p;
    }
    let rate = null;
    if (start && now > start.t) rate = Math.max(0, (done - start.completed - start.failed) / (now - start.t));
    const left = c.total - done;
    let eta = null;
    if (left <= 0) eta = 0;
    else if (rate && this.start) eta = left / rate;
    return { rate: rateText(rate), eta_label: "Time left", eta: duration(eta) };
  };

  function clock(unix) {
    return unix ? new Date(unix * 1000).toISOString().slice(11, 19) + " UTC" : "";
  }

  Chart.prototype.draw = function () {
    const pts = this.points;
    this.svg.dataset.points = pts.length;
    if (!pts.length) return;
    const t0 = this.start || pts[0].t;
    const t1 = Math.max(this.end || Math.max(pts[pts.length - 1].t, this.now()), t0 + 1);
    this.svg.dataset.t0 = t0;
    this.svg.dataset.t1 = t1;
    const top = Math.max(this.total, 1);
    function line(value) {
      return pts.map(function (p) {
        const x = 48 + ((Math.min(Math.max(p.t, t0), t1) - t0) / (t1 - t0)) * 902; // the axes drawn in batch.html's viewBox
        const y = 172 - (value(p) / top) * 160;
        return x.toFixed(1) + "," + y.toFixed(1);
      }).join(" ");
    }
    this.line.setAttribute("points", line(function (p) { return p.completed; }));
    this.failedLine.setAttribute("points", line(function (p) { return p.failed; }));
    this.max.textContent = int(this.total);
    this.startLabel.textContent = clock(t0);
    this.endLabel.textContent = (this.end ? "finished " : "now ") + clock(t1);
    this.span.textContent = duration(t1 - t0);
  };

  let chart = null;
  const chartSvg = document.querySelector("[data-chart]");
  const seedNode = document.getElementById("batch-data");
  if (chartSvg && seedNode) {
    const seed = JSON.parse(seedNode.textContent);
    const samples = JSON.parse(document.getElementById("batch-samples").textContent);
    const article = chartSvg.closest("[data-server-now]");
    const skew = article ? Date.now() / 1000 - Number(article.dataset.serverNow) : 0;
    chart = new Chart(chartSvg, seed, samples, skew);
    last.set(seed.id, progress(seed));
    let current = seed;
    // Time passes between pushes: the time left counts down and a stalled rate falls.
    setInterval(function () {
      const snapshot = current;
      const shown = chart.pace(snapshot);
      article.querySelectorAll('[data-field="rate"], [data-field="eta"], [data-field="eta_label"]').forEach(function (node) {
        node.textContent = shown[node.dataset.field];
      });
      if (!chart.end) chart.draw();
    }, 1000);
    chart.track = function (batch) { current = batch; };
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
      if (message.type === "batch.updated" && message.batch) {
        apply(message.batch, message);
        if (chart && chart.track && message.batch.id === chart.svg.closest("[data-batch]").dataset.batch) chart.track(message.batch);
      } else if (message.type === "operator.updated" && typeof message.html === "string") {
        document.querySelectorAll("[data-operator]").forEach(function (node) { node.innerHTML = message.html; });
      }
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

  // The new-batch form's metadata: one more key/value row a click, up to the API's 16 pairs.
  document.querySelectorAll("[data-add-pair]").forEach(function (button) {
    const fieldset = button.closest("[data-metadata]");
    const max = Number(button.dataset.max);
    function update() { button.hidden = fieldset.querySelectorAll("[data-pair]").length >= max; }
    button.addEventListener("click", function () {
      const rows = fieldset.querySelectorAll("[data-pair]");
      const row = rows[rows.length - 1].cloneNode(true);
      row.querySelectorAll("input").forEach(function (input) { input.value = ""; });
      button.before(row);
      row.querySelector("input").focus();
      update();
    });
    update();
  });

  // The new-batch form's window: the windows table marks the one picked (its price, whether it fits).
  document.querySelectorAll("select[data-window]").forEach(function (select) {
    function mark() {
      document.querySelectorAll("[data-window-row]").forEach(function (row) {
        const picked = row.dataset.windowRow === select.value;
        row.classList.toggle("picked", picked);
        if (picked) { row.setAttribute("aria-current", "true"); } else { row.removeAttribute("aria-current"); }
      });
    }
    select.addEventListener("change", mark);
    mark();
  });

  // The post-create banner shows once: drop ?created=1 so a reload doesn't bring it back.
  const query = new URLSearchParams(location.search);
  if (query.has("created")) {
    query.delete("created");
    const rest = query.toString();
    history.replaceState(history.state, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }

  document.querySelectorAll("form[data-new-batch]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      const quoting = event.submitter && event.submitter.hasAttribute("data-quote-button");
      const button = quoting ? event.submitter : form.querySelector("[data-submit]");
      button.disabled = true;
      button.textContent = quoting ? "Counting tokens and reading the queue\u2026" : "Uploading and checking every record\u2026";
      if (quoting) {
        // A disabled button's value is not sent: carry the action in a field of its own.
        const action = document.createElement("input");
        action.type = "hidden";
        action.name = "action";
        action.value = "quote";
        form.append(action);
      }
    });
  });
})();
