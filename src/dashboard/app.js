// sluice's dashboard. Everything it shows comes from the REST API
// (/v1/info, /v1/jobs, /v1/jobs/{id}/explain, /v1/datasets, /v1/nodes),
// read with the bearer token the user typed (kept in sessionStorage, so
// for this tab's session only). Data is written with textContent, never
// as HTML: dataset names and sample keys are user data.
"use strict";

const POLL_MS = 1000;
const HISTORY = 120; // chart points per job
const TOKEN_KEY = "sluice-token";

const state = {
  selected: null, // job id shown in detail
  history: {}, // job id -> [{t, delivered}]
  explain: {}, // job id -> {at: replans count, body}
  nodes: null, // last /v1/nodes answer, with the time it came
  timer: null,
};

const $ = (id) => document.getElementById(id);

function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "class") e.className = v;
    else if (k === "title") e.title = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

const fmt = {
  n: (x) => (x === null || x === undefined ? "-" : Math.round(x).toLocaleString("en-US")),
  rate: (x) => (x === null || x === undefined ? "-" : `${fmt.n(x)}/s`),
  pct: (x) => (x === null || x === undefined ? "-" : `${Math.round(x * 100)}%`),
  ms: (x) => (x < 10 ? x.toFixed(2) : x.toFixed(1)),
  bytes(b) {
    if (b === null || b === undefined) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
    return `${b.toFixed(i ? 1 : 0)} ${units[i]}`;
  },
};

class Refused extends Error {}

async function api(method, path) {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.authorization = `Bearer ${token}`;
  let r;
  try {
    r = await fetch(path, { method, headers });
  } catch (e) {
    throw new Error(`cannot reach the sluice server: ${e.message}`);
  }
  if (r.status === 401) throw new Refused(token ? "the server refused this token" : "");
  const body = await r.json().catch(() => null);
  if (!r.ok) {
    const why = body && body.message ? `${body.code}: ${body.message}` : `HTTP ${r.status}`;
    throw new Error(`${method} ${path}: ${why}`);
  }
  return body;
}

function message(text, isError) {
  const m = $("message");
  m.hidden = !text;
  m.textContent = text || "";
  m.className = isError ? "message error" : "message";
}

function askForToken(why) {
  clearTimeout(state.timer);
  $("main").hidden = true;
  $("login").hidden = false;
  message(why ? `Sign-in needed: ${why}. Type a valid token.`
    : "This server requires a bearer token. Type it to continue.", true);
  $("token").focus();
}

$("login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
  $("token").value = "";
  start();
});

async function start() {
  try {
    const info = await api("GET", "/v1/info");
    $("server").textContent = `v${info.version} · Flight ${info.flight}` +
      (info.auth ? " · token required" : "");
    $("login").hidden = true;
    $("main").hidden = false;
    message("");
    await tick();
  } catch (e) {
    if (e instanceof Refused) askForToken(e.message);
    else { message(e.message, true); state.timer = setTimeout(start, 3000); }
  }
}

let ticks = 0;
async function tick() {
  clearTimeout(state.timer);
  try {
    const jobs = await api("GET", "/v1/jobs");
    drawJobs(jobs);
    if (ticks % 5 === 0) drawDatasets(await api("GET", "/v1/datasets"));
    if (ticks % 2 === 0) drawStorage(await api("GET", "/v1/nodes"));
    const job = jobs.find((j) => j.id === state.selected);
    if (job) await drawJob(job);
    $("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    message("");
    ticks++;
  } catch (e) {
    if (e instanceof Refused) { askForToken(e.message); return; }
    message(e.message, true);
  }
  state.timer = setTimeout(tick, POLL_MS);
}

function record(job) {
  const h = (state.history[job.id] ||= []);
  const now = performance.now() / 1000;
  const last = h[h.length - 1];
  if (!last || now - last.t >= 0.5) h.push({ t: now, delivered: job.delivered });
  if (h.length > HISTORY + 1) h.shift();
}

function bottleneckText(st) {
  const b = st.stages && st.stages.bottleneck;
  if (b) return `${b.tier}${b.stage ? ` (${b.stage})` : ""} ${fmt.pct(b.busy)}`;
  return st.observed ? st.observed.bottleneck : "";
}

function drawJobs(jobs) {
  jobs.sort((a, b) => b.created - a.created);
  $("no-jobs").hidden = jobs.length > 0;
  if (!state.selected && jobs.length) state.selected = jobs[0].id;
  fill($("jobs").tBodies[0], jobs.map((j) => {
    record(j);
    const live = j.state === "pending" || j.state === "running";
    const cancel = live
      ? el("button", { class: "cancel", "data-job": j.id, onclick: (ev) => {
        ev.stopPropagation();
        cancelJob(j.id);
      } }, "cancel")
      : null;
    return el("tr", {
      class: `clickable${j.id === state.selected ? " selected" : ""}`,
      "data-job": j.id,
      "data-state": j.state,
      onclick: () => { state.selected = j.id; tick(); },
    },
    el("td", {}, j.id),
    el("td", {}, el("span", { class: `state ${j.state}` }, j.state)),
    el("td", {}, el("span", { class: "bar" },
      el("span", { style: `width:${Math.round(j.progress * 100)}%` })),
    ` ${(j.progress * 100).toFixed(1)}%`),
    el("td", { class: "num" }, fmt.n(j.delivered)),
    el("td", { class: "num" }, j.samples_per_s.toFixed(1)),
    el("td", { class: "num" }, fmt.n(j.skipped)),
    el("td", {}, bottleneckText(j)),
    el("td", {}, cancel));
  }));
}

async function cancelJob(id) {
  try {
    await api("DELETE", `/v1/jobs/${encodeURIComponent(id)}`);
    await tick();
  } catch (e) {
    if (e instanceof Refused) askForToken(e.message);
    else message(e.message, true);
  }
}

async function drawJob(st) {
  $("job").hidden = false;
  $("job-id").textContent = st.id;
  const s = $("job-state");
  s.textContent = st.state;
  s.className = `state ${st.state}`;
  $("job-error").hidden = !st.error;
  $("job-error").textContent = st.error || "";
  drawChart(state.history[st.id] || []);
  fill($("ranks"), (st.ranks || []).map((r) => el("div", {},
    `rank ${r.rank} · epoch ${r.epoch} `,
    el("span", { class: "bar" }, el("span", { style: `width:${Math.round(100 * r.delivered / Math.max(r.of, 1))}%` })),
    ` ${fmt.n(r.delivered)} / ${fmt.n(r.of)}${r.epochs_done ? ` · ${r.epochs_done} epoch(s) done` : ""}`)));
  if (!(st.ranks || []).length) $("ranks").textContent = "no reader yet";
  drawMix(st.mix);
  drawFailovers(st.failovers || []);
  fill($("bytes").tBodies[0], [
    ["storage → compute (link)", st.bytes.link],
    ["compute → trainers (Flight)", st.bytes.trainer],
    ["shared memory to trainers", st.bytes.shm || 0],
  ].map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", { class: "num" }, fmt.bytes(v)))));
  const bad = st.bad_samples || [];
  $("no-bad").hidden = bad.length > 0;
  fill($("bad").tBodies[0], bad.slice(0, 50).map((b) =>
    el("tr", {}, el("td", {}, b.key), el("td", {}, b.udf), el("td", {}, b.reason))));
  const replans = (st.replans || []).length;
  const cached = state.explain[st.id];
  if (!cached || cached.at !== replans || (!cached.body.analyze && st.stages)) {
    state.explain[st.id] = { at: replans, body: await api("GET", `/v1/jobs/${encodeURIComponent(st.id)}/explain`) };
  }
  drawPlacement(state.explain[st.id].body.placement, st.stages);
  drawStages(st.stages);
}

// A mixture's parts: planned weight beside the share of the latest
// epoch's delivered positions each has taken.
function drawMix(mix) {
  $("mix-box").hidden = !mix;
  if (!mix) return;
  const rule = typeof mix.rule === "object" ? `${mix.rule.samples} samples` : mix.rule;
  $("mix-rule").textContent = `${rule} · ${fmt.n(mix.epoch_samples)} positions an epoch · ` +
    `shares of epoch ${mix.epoch} delivered`;
  const total = mix.parts.reduce((a, p) => a + p.weight, 0) || 1;
  fill($("mix").tBodies[0], mix.parts.map((p) => el("tr", {},
    el("td", {}, p.name),
    el("td", { class: "num" }, (p.weight / total).toFixed(3)),
    el("td", { class: "num" }, fmt.n(p.samples)),
    el("td", { class: "num" }, fmt.n(p.delivered)),
    el("td", { class: "num" }, p.share.toFixed(3)))));
}

// Storage nodes the job's windows found lost (or a replica corrupt), and
// the windows that ran again on other holders because of each.
function drawFailovers(failovers) {
  $("failover-box").hidden = failovers.length === 0;
  fill($("failovers").tBodies[0], failovers.map((f) => el("tr", {},
    el("td", {}, f.node),
    el("td", {}, f.what),
    el("td", {}, new Date(f.at * 1000).toLocaleTimeString()),
    el("td", { class: "num" }, fmt.n(f.windows)),
    el("td", {}, f.reason))));
}

function drawChart(h) {
  const svg = $("chart");
  const pts = [];
  for (let i = 1; i < h.length; i++) {
    const dt = h[i].t - h[i - 1].t;
    pts.push(dt > 0 ? (h[i].delivered - h[i - 1].delivered) / dt : 0);
  }
  const max = Math.max(1, ...pts);
  const line = pts.map((v, i) => `${(400 * i / Math.max(pts.length - 1, 1)).toFixed(1)},` +
    `${(115 - 110 * v / max).toFixed(1)}`).join(" ");
  svg.replaceChildren();
  const poly = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  poly.setAttribute("points", line);
  svg.append(poly);
  $("chart-label").textContent = pts.length
    ? `now ${fmt.rate(pts[pts.length - 1])} · peak ${fmt.rate(max)} · last ${pts.length} s`
    : "waiting for a reader";
}

// The stages of the chosen cut, each in the lane of the side that runs it.
function drawPlacement(placement, stages) {
  const p = placement && placement.pipelines && placement.pipelines[0];
  const box = $("placement");
  box.replaceChildren();
  if (!p) { $("placement-choice").textContent = "no pipeline"; return; }
  const choice = p.choice;
  const colocated = placement.resources && placement.resources.colocated;
  $("placement-choice").textContent = (choice.kind === "cut"
    ? `cut ${choice.cut}: the first ${choice.cut} stage(s) on storage, the rest on compute`
    : `per-sample split on ${choice.metric}: above ${choice.threshold} ` +
      `(${Math.round(choice.share_above * 100)}% of samples) at cut ${choice.above}, ` +
      `the rest at cut ${choice.below}`) +
    ` (offload ${typeof p.offload === "object" ? JSON.stringify(p.offload) : p.offload})` +
    (colocated ? ` · co-located: ${colocated}` : "");
  const cut = choice.kind === "cut" ? choice.cut : choice.below;
  const hot = stages && stages.bottleneck;
  const measured = (udf) => (stages ? stages.stages.filter((s) => s.udf === udf) : []);
  const tier = (name) => (stages ? stages.tiers.find((t) => t.tier === name) : null);
  const lane = (name, items, rates) => {
    const t = tier(name) || (colocated && name !== "trainer" ? tier("cpu") : null);
    const isHot = hot && (hot.tier === name || (hot.tier === "cpu" && items.some((i) => i.hot)));
    return el("div", { class: `lane${isHot ? " hot" : ""}`, "data-lane": name },
      el("h4", {}, name),
      ...items.map((i) => i.node),
      el("div", { class: "rate" }, rates || (t
        ? `busy ${fmt.pct(t.busy)} · sustains ${fmt.rate(t.capacity_per_s)} · est ${fmt.rate(t.estimated_per_s)}`
        : "")));
  };
  const stageBox = (udfs, side) => {
    const m = udfs.flatMap(measured).filter((s) => s.tier === side);
    const isHot = m.some((s) => s.bottleneck);
    const detail = m.map((s) => `${fmt.rate(s.samples_per_s)}, ${fmt.ms(s.mean_ms)} ms`).join("; ");
    return { hot: isHot, node: el("div", { class: `stage${isHot ? " hot" : ""}`, "data-stage": udfs.join(",") },
      udfs.join(" + "), detail ? el("div", { class: "rate" }, detail) : null) };
  };
  const onStorage = p.stages.slice(0, cut).map((u) => stageBox(u, "storage"));
  const onCompute = p.stages.slice(cut).map((u) => stageBox(u, "compute"));
  const link = tier("link");
  box.append(
    lane("storage", [{ node: el("div", { class: "stage" }, "read") }, ...onStorage]),
    el("span", { class: "arrow" }, "→"),
    lane("link", [], link
      ? `${link.bytes_per_s ? `${(link.bytes_per_s * 8 / 1e6).toFixed(1)} Mbit/s` : ""} busy ${fmt.pct(link.busy)}`
      : (colocated ? "memory (co-located)" : "")),
    el("span", { class: "arrow" }, "→"),
    lane("compute", onCompute),
    el("span", { class: "arrow" }, "→"),
    lane("trainer", [], tier("trainer") ? `waiting on readers ${fmt.pct(tier("trainer").busy)}` : ""));
}

function drawStages(s) {
  $("stages-over").textContent = s ? `(${s.over === "recent" ? "last seconds" : "whole job"}, ` +
    `${s.seconds.toFixed(1)} s, ${fmt.rate(s.samples_per_s)})` : "(none measured yet)";
  fill($("stages").tBodies[0], (s ? s.stages : []).map((x) => el("tr", { class: x.bottleneck ? "selected" : "" },
    el("td", {}, x.udf + (x.bottleneck ? "  ← bottleneck" : "")),
    el("td", {}, x.node ? `${x.tier} (${x.node})` : x.tier),
    el("td", { class: "num" }, fmt.n(x.samples_per_s)),
    el("td", { class: "num" }, fmt.ms(x.mean_ms)),
    el("td", { class: "num" }, fmt.ms(x.p90_ms)),
    el("td", { class: "num" }, fmt.pct(x.busy)))));
  fill($("tiers").tBodies[0], (s ? s.tiers : []).map((t) => el("tr", {},
    el("td", {}, t.tier), el("td", { class: "num" }, fmt.pct(t.busy)),
    el("td", { class: "num" }, fmt.rate(t.capacity_per_s)),
    el("td", { class: "num" }, fmt.rate(t.estimated_per_s)))));
  $("queues").textContent = s ? s.queues.map((q) =>
    `${q.queue} queue ${q.mean.toFixed(1)} of ${q.capacity}`).join(" · ") : "";
  const b = s && s.bottleneck;
  $("bottleneck").textContent = b
    ? `Bottleneck: ${b.tier}${b.stage ? ` (${b.stage})` : ""} at ${fmt.pct(b.busy)} busy; ` +
      (b.headroom ? `the next tier would limit the job at ${b.headroom.toFixed(1)}× this rate` : "nothing else is busy")
    : "";
}

// A cluster-ingested dataset's replication: its copies and its parts full,
// under-replicated and lost ("—" where no cluster ingest laid it out).
function replication(r) {
  if (!r) return "—";
  const parts = [`${r.replicas} copies: ${r.full} of ${r.parts} parts full`];
  if (r.under) parts.push(`${r.under} under-replicated`);
  if (r.lost) parts.push(`${r.lost} LOST`);
  return parts.join(", ");
}

function replicationClass(r) {
  return r && (r.under || r.lost) ? { class: "warn" } : {};
}

function drawDatasets(datasets) {
  fill($("datasets").tBodies[0], datasets.map((d) => el("tr", {},
    el("td", {}, d.name),
    el("td", {}, (d.versions || []).map((v) => `v${v.version} on ${v.node}`).join(", ")),
    el("td", replicationClass(d.replication), replication(d.replication)),
    el("td", { class: "num" }, fmt.n(d.samples)),
    el("td", { class: "num" }, fmt.bytes(d.bytes)),
    el("td", {}, (d.formats || []).join(", ")),
    el("td", {}, d.columns.map((c) => c.name).join(", ")))));
}

function drawStorage(c) {
  const now = performance.now() / 1000;
  const dev = c.device;
  const prev = state.nodes;
  state.nodes = { t: now, c };
  if (dev) {
    const used = dev.total_chunks - dev.free_chunks;
    let bw = "";
    if (prev && prev.c.device && now > prev.t) {
      bw = ` · reading ${fmt.bytes((dev.read_bytes - prev.c.device.read_bytes) / (now - prev.t))}/s`;
    }
    $("device").replaceChildren(el("p", {},
      `Device (${dev.backend}): ${fmt.bytes(dev.capacity)}, `,
      el("span", { class: "bar" }, el("span", { style: `width:${Math.round(100 * used / Math.max(dev.total_chunks, 1))}%` })),
      ` ${fmt.n(dev.free_chunks)} of ${fmt.n(dev.total_chunks)} chunks of ${fmt.bytes(dev.chunk_size)} free` +
      `${bw} · ${fmt.bytes(dev.read_bytes)} read · cache ${fmt.bytes(dev.cache_bytes)} of ` +
      `${fmt.bytes(dev.cache_budget)} (${fmt.n(dev.cache_hits)} hits, ${fmt.n(dev.cache_misses)} misses)`));
  } else {
    $("device").textContent = "No device here: this server's storage nodes are remote.";
  }
  fill($("nodes").tBodies[0], c.nodes.map((n) => el("tr", { "data-up": n.up },
    el("td", {}, n.name),
    el("td", {}, n.up ? "up" : `down: ${n.error || ""}`),
    el("td", { class: "num" }, n.cores === undefined ? "-" : n.cores),
    el("td", {}, n.link_limit ? `${(n.link_limit * 8 / 1e6).toFixed(0)} Mbit/s` : "unlimited"),
    el("td", {}, n.on_this_host ? "this host" : "remote"))));
  const compute = c.compute || [];
  $("compute-none").hidden = compute.length > 0;
  $("compute").hidden = compute.length === 0;
  fill($("compute").tBodies[0], compute.map((n) => el("tr", {},
    el("td", {}, n.location),
    el("td", { class: "num" }, `${n.last_seen_s.toFixed(1)} s ago`))));
  const held = c.quarantined || [];
  $("quarantine").hidden = held.length === 0;
  fill($("quarantined").tBodies[0], held.map((q) => el("tr", {},
    el("td", {}, q.location),
    el("td", {}, q.by),
    el("td", {}, q.unknown.map((u) => `${u.dataset}@${u.version}`).join(", ")))));
}

start();
