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
      `change ${r.plan_epoch} in flight (${r.from_config} → ${r.to_config}): ${r.phase}, ` +
      `${bytes(r.bytes_done)} of ${bytes(r.bytes_total)}`,
      r.hosts_total ? `, ${r.hosts_done} of ${r.hosts_total} hosts done` : "",
      r.plan && r.plan.cross_host_bytes ? `; ${bytes(r.plan.cross_host_bytes)} across hosts` : "",
      r.reason ? ` (${r.reason})` : "",
      el("div", { class: "bar" }, el("div", { style: { width: `${pct.toFixed(1)}%` } })));
  }
  return el("div", { class: `change ${r.phase}`, "data-phase": r.phase },
    `last change: ${describeChange(r)}`);
}

// "3: tp=2 -> tp=1,dp=2, committed in 1.2 s (staging ..., verifying ...), ..."
function describeChange(r) {
  const took = r.seconds ? ` in ${seconds(r.seconds)} (staging ${seconds(r.staging_seconds)},` +
    ` verifying ${seconds(r.verifying_seconds)}), ${bytes(r.bytes_from_peers)} from peers` : "";
  const what = r.from_config || r.to_config ? `${r.from_config} → ${r.to_config}, ` : "";
  return `${r.plan_epoch ? `${r.plan_epoch}: ` : ""}${what}${r.phase}${took}` +
    (r.path ? `, ${r.path}` : "") + (r.reason ? `; ${r.reason}` : "") +
    (r.error ? `; ${r.error}` : "");
}

function renderHistory(j) {
  const past = j.recent_changes || [];
  if (!past.length) return null;
  return el("details", { class: "history" },
    el("summary", {}, `${past.length} earlier change${past.length === 1 ? "" : "s"}`),
    el("ul", {}, ...past.map((r) => el("li", { "data-phase": r.phase }, describeChange(r)))));
}

// A change's plan as a matrix of bytes from each host (rows) to each
// (columns), the diagonal what is copied within a host, and each target
// host's staging progress.
function renderPlan(r, hostIndex) {
  const flows = (r.plan && r.plan.flows) || [];
  if (!flows.length && !(r.host_progress || []).length) return null;
  const names = [...new Set(flows.flatMap((f) => [f.from, f.to]))].sort((a, b) =>
    a === "snapshot" ? -1 : b === "snapshot" ? 1 : a.localeCompare(b, "en", { numeric: true }));
  const bytesOf = new Map(flows.map((f) => [`${f.from}\u0000${f.to}`, f.bytes]));
  const peak = Math.max(1024, ...flows.map((f) => f.bytes));
  const shade = (b, diagonal) => {
    if (!b) return "#f4f4f4";
    const t = Math.min(1, Math.max(0, (Math.log(Math.max(b, 1024)) - Math.log(1024)) /
                                   (Math.log(peak) - Math.log(1024) || 1)));
    return `hsl(${diagonal ? 140 : 215},${diagonal ? 45 : 70}%,${Math.round(92 - 60 * t)}%)`;
  };
  const swatch = (h) => el("span", { class: "swatch", style: {
    background: hostIndex.has(h) ? hue(hostIndex.get(h)) : "#999" } });
  const out = el("div", { class: "plan" });
  if (flows.length) {
    const head = el("tr", {}, el("th", {}, "from \\ to"),
      ...names.filter((n) => n !== "snapshot").map((n) => el("th", {}, swatch(n), n)));
    const rows = names.map((from) => el("tr", {}, el("th", {}, from === "snapshot" ? "" : swatch(from), from),
      ...names.filter((n) => n !== "snapshot").map((to) => {
        const b = bytesOf.get(`${from}\u0000${to}`) || 0;
        const dark = b && Math.log(Math.max(b, 1024)) > (Math.log(1024) + Math.log(peak)) / 2;
        return el("td", { class: "flow" + (dark ? " dark" : ""), "data-from": from, "data-to": to,
                          "data-bytes": b, style: { background: shade(b, from === to) } },
                  b ? bytes(b) : "");
      })));
    out.append(el("div", { class: "strip-label" },
                  "the plan: bytes from each host (rows) to each (columns); the diagonal is copied within a host"),
               el("table", { class: "matrix" }, head, ...rows));
  }
  const progress = r.host_progress || [];
  if (progress.length) {
    out.append(el("div", { class: "strip-label" }, "each target host's staging"),
      el("div", { class: "hosts-progress" }, ...progress.map((h) => el("div", { "data-host": h.host,
        class: "host-progress" + (h.done ? " done" : "") }, swatch(h.host), `${h.host} `,
        el("span", { class: "bar small inline" }, el("div", { style: {
          width: `${h.bytes_total ? Math.min(100, (100 * h.bytes_done) / h.bytes_total).toFixed(1) : 100}%` } })),
        ` ${bytes(h.bytes_done)} of ${bytes(h.bytes_total)}${h.done ? ", done" : ""}`))));
  }
  return out;
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
      renderHistory(j),
      renderPlan(r, hostIndex),
      ...strip("ranks now, by host", j.rank_hosts, hostIndex, dead),
    ];
    if (RUNNING.has(r.phase) && r.plan && r.plan.rank_hosts.length)
      parts.push(...strip("ranks after the change", r.plan.rank_hosts, hostIndex, dead));
    const held = [...new Set(j.rank_hosts)];
    parts.push(el("div", { class: "legend" }, ...held.map((h) =>
      el("span", {}, el("span", { class: "swatch", style: { background: hue(hostIndex.get(h)) } }),
         h, dead.has(h) ? " (dead)" : ""))));
    if (j.survival) parts.push(el("div", { class: "survival" }, j.survival));
    // Small objects only one host holds: the copies the coordinator keeps.
    if (j.small_objects_to_keep) {
      parts.push(el("div", { class: "survival kept" },
        `small objects with every copy on one host: ${j.small_objects_to_keep}, ` +
        `of which the coordinator keeps a copy of ${j.kept_small_objects} ` +
        `(${bytes(j.kept_small_object_bytes)})`));
    }
    const card = el("div", { class: "job", "data-job": j.job }, ...parts);
    updateLayout(j, hostIndex).then((box) => card.append(box));
    return card;
  }));
  for (const name of layouts.keys())
    if (!jobs.some((j) => j.job === name)) layouts.delete(name);
  document.getElementById("job-count").textContent = `${jobs.length}`;
}

// Each job's layout picture: kept across refreshes (its tensor choice),
// fetched again only when the job's layout or the choice changes.
const layouts = new Map();  // job -> {box, select, key, tensor}
const SVG = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// The chosen tensor's distinct regions over its first two dimensions
// (rows: dim 0, columns: dim 1; a 1-D tensor is one row), each split into
// one band per rank holding it, coloured by that rank's host: replicas
// show as bands of several colours.
function drawTensor(data, hostIndex) {
  const t = data.tensor;
  const rows = t.shape.length >= 2 ? t.shape[0] : 1;
  const cols = t.shape.length >= 2 ? t.shape[1] : t.shape[0] || 1;
  const W = 520, H = Math.max(60, Math.min(240, Math.round((W * rows) / cols)));
  const svg = svgEl("svg", { width: W + 2, height: H + 2, class: "tensor" });
  for (const reg of t.regions) {
    const [r0, r1] = t.shape.length >= 2 ? reg.region[0] : [0, 1];
    const [c0, c1] = t.shape.length >= 2 ? reg.region[1] : reg.region[0];
    const x = 1 + (W * c0) / cols, w = Math.max(1, (W * (c1 - c0)) / cols);
    const y = 1 + (H * r0) / rows, h = Math.max(1, (H * (r1 - r0)) / rows);
    const hosts = reg.ranks.map((r) => data.rank_hosts[r] || "?");
    const g = svgEl("g", { "data-region": JSON.stringify(reg.region),
                           "data-ranks": reg.ranks.join(","), "data-hosts": hosts.join(",") });
    g.append(svgEl("title", {}, `${t.key} ${reg.region.map(([b, e]) => `[${b}:${e}]`).join("")}` +
                   ` held by ${reg.ranks.map((r, i) => `rank ${r} (${hosts[i]})`).join(", ")}`));
    const bands = Math.min(reg.ranks.length, 8);
    const bh = h / bands;
    for (let i = 0; i < bands; i++) {
      g.append(svgEl("rect", { x, y: y + bh * i, width: w, height: bh,
                               fill: hostIndex.has(hosts[i]) ? hue(hostIndex.get(hosts[i])) : "#ccc" }));
      if (i > 0)  // a replica's band, not a cut of the tensor
        g.append(svgEl("line", { x1: x, x2: x + w, y1: y + bh * i, y2: y + bh * i,
                                 stroke: "#fff", "stroke-dasharray": "4 3" }));
      const label = `rank ${reg.ranks[i]} on ${hosts[i]}`;
      if (w > 6 * label.length && bh > 13)
        g.append(svgEl("text", { x: x + w / 2, y: y + bh * i + bh / 2 + 4, "text-anchor": "middle",
                                 class: "region-label" }, label));
    }
    g.append(svgEl("rect", { x, y, width: w, height: h, fill: "none", stroke: "#fff",
                             "stroke-width": 1.5 }));
    svg.append(g);
  }
  return svg;
}

async function updateLayout(job, hostIndex) {
  let l = layouts.get(job.job);
  if (!l) {
    const select = el("select", { class: "tensor-choice" });
    const box = el("div", { class: "layout" },
      el("div", { class: "strip-label" }, "a tensor's regions, by the hosts of the ranks that hold them: ",
         select), el("div", { class: "picture" }));
    l = { box, select, key: "", tensor: 0 };
    select.addEventListener("change", () => { l.tensor = Number(select.value); l.key = ""; });
    layouts.set(job.job, l);
  }
  const key = `${job.layout_epoch}/${job.config}/${l.tensor}/${job.rank_hosts.join(",")}`;
  if (key === l.key) return l.box;
  l.key = key;
  try {
    const data = await get(`api/layout?job=${encodeURIComponent(job.job)}&tensor=${l.tensor}`);
    if (l.select.options.length !== data.tensors.length) {
      l.select.replaceChildren(...data.tensors.map((t, i) =>
        el("option", { value: i }, `${t.key} [${t.shape.join(", ")}]`)));
    }
    l.select.value = String(l.tensor);
    const shape = data.tensor.shape.length > 2 ? " (its first two dimensions)" : "";
    l.box.querySelector(".picture").replaceChildren(drawTensor(data, hostIndex),
      el("div", { class: "legend" }, `${data.tensor.regions.length} distinct ` +
         `region${data.tensor.regions.length === 1 ? "" : "s"}${shape}; ` +
         "a region several ranks hold (replicas) shows one band per rank, parted by dashes"));
  } catch (e) {
    l.key = "";
    l.box.querySelector(".picture").replaceChildren(el("div", { class: "legend" }, e.message));
  }
  return l.box;
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
