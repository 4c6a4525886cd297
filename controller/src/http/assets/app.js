// Drover's read-only web page. Everything a user controls (job names, users, reasons) is written with
// textContent, never parsed as HTML, so a job named "<script>" shows as text.
"use strict";

const REFRESH_MS = 2000;

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function fillTable(id, rows, render) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const item of rows) {
    const tr = document.createElement("tr");
    render(tr, item);
    body.appendChild(tr);
  }
}

function time(ms) {
  return ms === null || ms === undefined ? "-" : new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function duration(fromMs, toMs) {
  if (fromMs === null || fromMs === undefined || toMs === null || toMs === undefined) return "";
  const s = Math.max(0, Math.round((toMs - fromMs) / 1000));
  return " (" + Math.floor(s / 3600) + "h" + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m" + String(s % 60).padStart(2, "0") + "s)";
}

async function getJson(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) throw new Error(path + ": " + response.status + " " + (await response.text()));
  return response.json();
}

function showError(error) {
  const el = document.getElementById("error");
  el.textContent = error ? String(error.message || error) : "";
  el.hidden = !error;
}

function hours(h) {
  return h.toFixed(2);
}

function ratio(r) {
  return r === null || r === undefined ? "-" : (100 * r).toFixed(1) + " %";
}

function goodputRow(tr, g) {
  cell(tr, g.account);
  cell(tr, hours(g.allocated_gpu_hours));
  cell(tr, hours(g.lost_to_failures_gpu_hours));
  cell(tr, hours(g.lost_to_preemption_gpu_hours));
  cell(tr, g.failed_incarnations);
  cell(tr, Math.round(g.down_after_failures_s) + " s");
  cell(tr, ratio(g.ratio));
}

function renderOverview(o) {
  document.getElementById("cluster").textContent = o.cluster || "";
  document.getElementById("source").textContent =
    "as replica " + o.answered_by + " has applied it, up to log index " + o.applied_index;
  const summary = document.getElementById("summary");
  summary.replaceChildren();
  for (const [label, value] of [["running", o.summary.running], ["pending", o.summary.pending],
    ["GPUs in use", o.summary.gpus_allocated + " / " + o.summary.gpus]]) {
    const div = document.createElement("div");
    const b = document.createElement("b");
    b.textContent = String(value);
    div.appendChild(b);
    div.appendChild(document.createTextNode(label));
    summary.appendChild(div);
  }
  fillTable("replicas", o.replicas, (tr, r) => {
    tr.dataset.replica = r.id;
    cell(tr, r.id);
    cell(tr, r.address);
    cell(tr, r.role, r.role === "leader" ? "leader" : r.role === "unreachable" ? "unreachable" : "");
    cell(tr, r.reachable ? r.term : "");
    cell(tr, r.leader === null ? "none" : r.leader);
    cell(tr, r.reachable ? r.last_log_index : "");
    cell(tr, r.reachable ? r.applied_index : "");
    cell(tr, r.error);
  });
  fillTable("nodes", o.nodes, (tr, n) => {
    tr.dataset.node = n.name;
    cell(tr, n.name);
    cell(tr, n.state, n.state);
    cell(tr, n.site || "");
    cell(tr, n.gpus);
    cell(tr, n.gpus_allocated);
    cell(tr, n.gpu_model || "");
    cell(tr, n.jobs.join(","));
    cell(tr, n.reason);
  });
  document.getElementById("goodput-since").textContent =
    o.goodput_since_ms === null ? "(nothing ended yet)" : "(since " + time(o.goodput_since_ms) + ", ended incarnations)";
  fillTable("goodput", o.goodput_accounts.concat([Object.assign({ account: "TOTAL" }, o.goodput)]), (tr, g) => {
    tr.dataset.account = g.account;
    goodputRow(tr, g);
  });
  document.getElementById("queue-count").textContent =
    "(" + o.queue_total + (o.queue_total > o.queue.length ? ", first " + o.queue.length + " shown" : "") + ")";
  fillTable("queue", o.queue, (tr, j) => {
    tr.dataset.job = j.id;
    const id = cell(tr, "");
    const link = document.createElement("a");
    link.href = "#job=" + j.id;
    link.textContent = String(j.id);
    id.appendChild(link);
    cell(tr, j.name);
    cell(tr, j.user);
    cell(tr, j.partition);
    cell(tr, j.state, j.state);
    cell(tr, j.state === "PENDING" ? j.reason : "");
    cell(tr, j.gpus);
    cell(tr, j.nodes.join(","));
    cell(tr, j.restarts);
  });
}

function fact(dl, term, value) {
  const dt = document.createElement("dt");
  dt.textContent = term;
  const dd = document.createElement("dd");
  dd.textContent = value === null || value === undefined ? "-" : String(value);
  dl.appendChild(dt);
  dl.appendChild(dd);
}

function event(list, kind, text) {
  const li = document.createElement("li");
  li.dataset.kind = kind;
  li.textContent = text;
  list.appendChild(li);
}

function renderJob(j) {
  document.getElementById("source").textContent = "job " + j.id + " as replica " + j.answered_by + " has applied it";
  document.getElementById("job-id").textContent = String(j.id);
  const facts = document.getElementById("job-facts");
  facts.replaceChildren();
  fact(facts, "Name", j.name);
  fact(facts, "User", j.user);
  fact(facts, "Account", j.account);
  fact(facts, "Partition", j.partition);
  fact(facts, "State", j.state + (j.state === "PENDING" ? " (" + j.reason + ")" : ""));
  fact(facts, "GPUs", j.gpus);
  fact(facts, "Nodes", j.nodes.join(","));
  fact(facts, "Restarts", j.restarts);
  fact(facts, "Latest checkpoint", j.checkpoint ? (j.checkpoint.step === null ? "" : "step " + j.checkpoint.step + " ") + "at " + time(j.checkpoint.time_ms) : null);
  fact(facts, "Last progress", j.progress ? (j.progress.step === null ? "" : "step " + j.progress.step + " ") + "at " + time(j.progress.time_ms) : null);
  fact(facts, "Progress timeout", j.progress_timeout_s ? j.progress_timeout_s + " s" : null);
  const goodput = document.getElementById("job-goodput");
  goodput.replaceChildren();
  fact(goodput, "GPU-hours", hours(j.goodput.allocated_gpu_hours));
  fact(goodput, "Lost to failures", hours(j.goodput.lost_to_failures_gpu_hours) + " GPU-hours in " + j.goodput.failed_incarnations + " failed incarnation(s)");
  fact(goodput, "Lost to preemption", hours(j.goodput.lost_to_preemption_gpu_hours) + " GPU-hours");
  fact(goodput, "Down after failures", Math.round(j.goodput.down_after_failures_s) + " s");
  fact(goodput, "Goodput", ratio(j.goodput.ratio));
  const list = document.getElementById("timeline");
  list.replaceChildren();
  event(list, "submit", time(j.submit_ms) + " submitted");
  for (const h of j.history) {
    event(list, "incarnation", "incarnation " + h.incarnation + " on " + h.nodes + ": " + time(h.start_ms) + " to " +
      time(h.end_ms) + duration(h.start_ms, h.end_ms) + ", ended " + h.state + (h.reason ? " (" + h.reason + ")" : "") +
      (h.resumed ? ", had resumed from a checkpoint" : "") +
      (h.last_checkpoint_ms ? "; its last checkpoint " + time(h.last_checkpoint_ms) : "; no checkpoint of its own"));
  }
  if (j.checkpoint) {
    event(list, "checkpoint", time(j.checkpoint.time_ms) + " checkpoint" + (j.checkpoint.step === null ? "" : " (step " + j.checkpoint.step + ")") + " recorded by incarnation " + j.checkpoint.incarnation);
  }
  if (j.start_ms !== null) {
    event(list, "current", "incarnation " + j.incarnation + " on " + j.nodes.join(",") + ": started " + time(j.start_ms) +
      (j.end_ms !== null ? ", ended " + time(j.end_ms) + duration(j.start_ms, j.end_ms) + " " + j.state + " (exit " + j.exit_code + ")" : ", " + j.state));
  }
}

async function refresh() {
  const match = /^#job=(\d+)$/.exec(location.hash);
  document.getElementById("job").hidden = !match;
  document.getElementById("overview").hidden = !!match;
  try {
    if (match) {
      renderJob(await getJson("/api/job?id=" + match[1]));
      document.body.dataset.loaded = "job";
    } else {
      renderOverview(await getJson("/api/overview"));
      document.body.dataset.loaded = "overview";
    }
    showError(null);
  } catch (error) {
    showError(error);
    document.body.dataset.loaded = "error";
  }
}

window.addEventListener("hashchange", refresh);
refresh();
setInterval(refresh, REFRESH_MS);
