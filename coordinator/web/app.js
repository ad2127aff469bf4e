// ptc's web view: reads /api/hosts and /api/jobs (what `ptcctl hosts
// --json` and `ptcctl jobs --json` print) every second and draws them.
// Data only ever goes into text nodes and attributes, never into HTML.
"use strict";

const RUNNING = new Set(["staging", "verifying", "committing"]);

// A host's colour: hues spread by the golden angle (as ptcctl plan --svg).
function hue(i) {
  return `hsl(${Math.round((i * 137.508) % 360)},55%,62%)`;
}

function bytes(b) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let u = 0;
  while (b >= 1024 && u < units.length - 1) {
    b /= 1024;
    u++;
  }
  return u === 0 ? `${b} B` : `${b.toFixed(b < 10 ? 2 : b < 100 ? 1 : 0)} ${units[u]}`;
}

function seconds(s) {
  return s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(s < 10 ? 2 : 1)} s`;
}

// el("td", {class: "num"}, "text", child, ...)
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "style") Object.assign(e.style, v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

async function get(path) {
  const r = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (r.status === 401) throw new Error("signed out: open this page with /?token=TOKEN again");
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  return body;
}

// The ranks of a placement as cells coloured by host.
function strip(label, rankHosts, hostIndex, dead) {
  const cells = rankHosts.map((h, r) =>
    el("div", {
      class: "rank" + (dead.has(h) ? " dead" : ""),
      title: `rank ${r} on ${h}${dead.has(h) ? " (dead)" : ""}`,
      "data-rank": r, "data-host": h,
      style: { background: hostIndex.has(h) ? hue(hostIndex.get(h)) : "#ccc" },
    }, rankHosts.length <= 512 ? r : ""));
  return [el("div", { class: "strip-label" }, label), el("div", { class: "strip" }, ...cells)];
}

function renderHosts(hosts, jobs, hostIndex) {
  const used = new Map();  // host -> {job: ranks}
  for (const j of jobs) {
    for (const h of j.rank_hosts) {
      const m = used.get(h) || new Map();
      m.set(j.job, (m.get(j.job) || 0) + 1);
      used.set(h, m);
    }
  }
  const body = document.querySelector("#hosts tbody");
  body.replaceChildren(...hosts.map((h) => {
    const state = !h.alive ? "dead" : h.draining ? "draining" : "alive";
    const jobsHere = used.get(h.name) || new Map();
    let n = 0;
    for (const c of jobsHere.values()) n += c;
    const which = [...jobsHere].map(([j, c]) => `${j}: ${c}`).join(", ");
    return el("tr", { "data-host": h.name },
      el("td", {}, el("span", { class: "swatch", style: { background: hue(hostIndex.get(h.name)) } }),
         h.name),
      el("td", {}, el("span", { class: `state ${state}` }, state)),
      el("td", { class: "gpus" }, `${n} of ${h.gpus}`, which ? ` (${which})` : ""),
      el("td", { class: "memory" },
        `${bytes(h.memory_used_bytes || 0)} of ${bytes(h.memory_bytes)}`,
        el("div", { class: "bar small" }, el("div", { style: {
          width: `${h.memory_bytes ? Math.min(100, (100 * (h.memory_used_bytes || 0)) / h.memory_bytes).toFixed(1) : 0}%` } }))),
      el("td", {}, h.domain || "the host alone"),
      el("td", { class: "num" }, `${seconds(h.seconds_since_heartbeat)} ago`));
  }));
  document.getElementById("host-count").textContent =
    `${hosts.filter((h) => h.alive).length} alive of ${hosts.length}`;
}

function renderChange(j) {
  const r = j.reconfiguration;
  if (!r || r.phase === "none") return el("div", { class: "change" }, "no change yet");
  if (RUNNING.has(r.phase)) {
    const pct = r.bytes_total > 0 ? Math.min(100, (100 * r.bytes_done) / r.bytes_total) : 0;
    return el("div", { class: "change running", "data-phase": r.phase },
      `change ${r.plan_epoch} in flight: ${r.phase}, ${bytes(r.bytes_done)} of ${bytes(r.bytes_total)}`,
      r.hosts_total ? `, ${r.hosts_done} of ${r.hosts_total} hosts done` : "",
      r.plan && r.plan.cross_host_bytes ? `; ${bytes(r.plan.cross_host_bytes)} across hosts` : "",
      r.reason ? ` (${r.reason})` : "",
      el("div", { class: "bar" }, el("div", { style: { width: `${pct.toFixed(1)}%` } })));
  }
  const took = r.seconds ? ` in ${seconds(r.seconds)} (staging ${seconds(r.staging_seconds)},` +
    ` verifying ${seconds(r.verifying_seconds)}), ${bytes(r.bytes_from_peers)} from peers` : "";
  return el("div", { class: `change ${r.phase}`, "data-phase": r.phase },
    `last change (${r.plan_epoch}): ${r.phase}${took}`,
    r.path ? `, ${r.path}` : "", r.reason ? `; ${r.reason}` : "",
    r.error ? `; ${r.error}` : "");
}

function renderJobs(jobs, hostIndex, dead) {
  const box = document.getElementById("jobs");
  box.replaceChildren(...jobs.map((j) => {
    const r = j.reconfiguration || {};
    const policy = j.auto && j.auto.enabled ?
      `automatic changes on${j.auto.live ? ", live" : ""}${j.auto.hot ? ", hot" : ""}` :
      "automatic changes off";
    const parts = [
      el("h3", {}, j.job, " ", el("span", { class: "config" }, j.config)),
      el("div", { class: "facts" },
        el("span", {}, "model ", el("b", {}, j.model)),
        el("span", { class: "epoch" }, "layout epoch ", el("b", {}, j.layout_epoch)),
        el("span", { class: "version" }, "committed version ", el("b", {}, j.committed_version),
           ` (step ${j.committed_step})`),
        el("span", {}, el("b", {}, j.ranks), " ranks, ", bytes(j.state_bytes)),
        j.open_saves.length ? el("span", {}, `saves open: ${j.open_saves.join(", ")}`) : null,
        el("span", {}, policy),
        j.pending_config ? el("span", {}, `pending: ${j.pending_config} (${j.pending_reason})`) : null),
      renderChange(j),
      ...strip("ranks now, by host", j.rank_hosts, hostIndex, dead),
    ];
    if (RUNNING.has(r.phase) && r.plan && r.plan.rank_hosts.length)
      parts.push(...strip("ranks after the change", r.plan.rank_hosts, hostIndex, dead));
    const held = [...new Set(j.rank_hosts)];
    parts.push(el("div", { class: "legend" }, ...held.map((h) =>
      el("span", {}, el("span", { class: "swatch", style: { background: hue(hostIndex.get(h)) } }),
         h, dead.has(h) ? " (dead)" : ""))));
    if (j.survival) parts.push(el("div", { class: "survival" }, j.survival));
    return el("div", { class: "job", "data-job": j.job }, ...parts);
  }));
  document.getElementById("job-count").textContent = `${jobs.length}`;
}

async function refresh() {
  const error = document.getElementById("error");
  try {
    const [h, j] = await Promise.all([get("api/hosts"), get("api/jobs")]);
    const hosts = h.hosts.slice().sort((a, b) => a.name.localeCompare(b.name, "en", { numeric: true }));
    const hostIndex = new Map(hosts.map((x, i) => [x.name, i]));
    const dead = new Set(hosts.filter((x) => !x.alive).map((x) => x.name));
    renderHosts(hosts, j.jobs, hostIndex);
    renderJobs(j.jobs, hostIndex, dead);
    error.hidden = true;
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    error.textContent = `The coordinator did not answer: ${e.message}`;
    error.hidden = false;
  }
}

document.getElementById("where").textContent = location.host;
refresh();
setInterval(refresh, 1000);
