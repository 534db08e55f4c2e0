/* tessera console: a small single-page app over the REST API (same token as the CLI).
   Pages: overview, gpus, projects, workloads (list + detail), submit, metrics, login.
   DOM is built with h() (text nodes only, never innerHTML with data). */
"use strict";

const TOKEN_KEY = "tessera.token";
/* The token lives in localStorage, so a second tab or a shared link does not ask to log in
   again (the same origin only; Log out removes it everywhere). */
const store = window.localStorage;
const KIND_PATH = { Training: "trainings", Workspace: "workspaces", Inference: "inferences" };
const main = document.getElementById("main");
let timers = [];

/* ---------- small helpers ---------- */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
function fmtBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0; let v = Number(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v >= 100 || i === 0 ? Math.round(v) : v.toFixed(1).replace(/\.0$/, "")} ${units[i]}`;
}
function fmtGpus(x) { return x === null || x === undefined ? "—" : Number(x).toFixed(2).replace(/\.?0+$/, "") || "0"; }
function age(iso) {
  if (!iso) return "—";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.round(s / 60)}m`;
  if (s < 86400) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86400)}d`;
}
/* A colour per project or workload, given in the order names are first drawn (so two series
   never share one while the palette lasts; past it, hues spaced by the golden angle). */
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f", "#ff9da7", "#86bcb6"];
const colours = new Map();
function color(name) {
  const key = String(name);
  if (!colours.has(key)) {
    const i = colours.size;
    colours.set(key, i < PALETTE.length ? PALETTE[i] : `hsl(${Math.round((i * 137.508) % 360)}, 55%, 48%)`);
  }
  return colours.get(key);
}
/* Text on a coloured background: black or white, whichever contrasts more (WCAG luminance; one
   of the two always reaches 4.5:1). */
function inkOn(bg) {
  const probe = inkOn.cache || (inkOn.cache = new Map());
  if (probe.has(bg)) return probe.get(bg);
  const el = document.createElement("i"); el.style.color = bg; document.body.append(el);
  const rgb = getComputedStyle(el).color.match(/[0-9.]+/g).slice(0, 3).map(Number); el.remove();
  const lin = rgb.map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
  const L = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
  const ink = (1.05 / (L + 0.05)) >= ((L + 0.05) / 0.05) ? "#ffffff" : "#000000";
  probe.set(bg, ink);
  return ink;
}
/* replaceChildren with h()'s rules: arrays flattened, null/false dropped. */
function put(el, ...children) { el.replaceChildren(...h("div", {}, ...children).childNodes); }
function toast(msg) {
  const t = h("div", {}, msg);
  document.getElementById("toast").append(t);
  setTimeout(() => t.remove(), 4000);
}
function every(ms, fn) { timers.push(setInterval(fn, ms)); }
function clearTimers() { timers.forEach(clearInterval); timers = []; }

/* ---------- the API ---------- */
class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status; this.details = (body && body.details) || [];
  }
}
/* When the server cannot be reached: a banner with the time of the data shown, a probe of
   /healthz with back-off (1 s, doubling to 30 s), and the page drawn again once it answers. */
const down = { since: null, lastOk: null, delay: 1000, timer: null };
function serverDown() {
  if (down.since === null) down.since = Date.now();
  const banner = document.getElementById("down");
  const when = down.lastOk ? new Date(down.lastOk).toLocaleTimeString() : "before this page loaded";
  banner.textContent = `The tessera server cannot be reached: showing data from ${when}; retrying in ${Math.round(down.delay / 1000)} s.`;
  banner.hidden = false;
  if (down.timer) return;
  down.timer = setTimeout(async () => {
    down.timer = null;
    const ok = await fetch("/healthz", { cache: "no-store" }).then((r) => r.ok).catch(() => false);
    if (ok) { serverUp(); route(); return; }
    down.delay = Math.min(30000, down.delay * 2);
    serverDown();
  }, down.delay);
}
function serverUp() {
  down.lastOk = Date.now();
  if (down.since === null) return;
  down.since = null; down.delay = 1000;
  if (down.timer) { clearTimeout(down.timer); down.timer = null; }
  document.getElementById("down").hidden = true;
}
async function api(path, opts = {}) {
  const headers = { Accept: "application/json" };
  const token = store.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  let r;
  try {
    r = await fetch(path, { method: opts.method || "GET", headers,
      body: opts.body === undefined ? undefined : JSON.stringify(opts.body) });
  } catch (e) { serverDown(); throw new ApiError(0, { message: "the tessera server cannot be reached (retrying)" }); }
  serverUp();
  if (r.status === 401 && !opts.login) { store.removeItem(TOKEN_KEY); location.hash = "#/login"; throw new ApiError(401, {}); }
  if (opts.text) { if (!r.ok) throw new ApiError(r.status, {}); return { text: await r.text(), next: r.headers.get("X-Next-Offset") }; }
  const body = r.status === 204 ? null : await r.json().catch(() => null);
  if (!r.ok) throw new ApiError(r.status, body);
  if (body && typeof body.simulated === "boolean") document.getElementById("sim").hidden = !body.simulated;  /* every page says it */
  return body;
}

/* ---------- pages ---------- */
const pages = { login, overview, projects, workloads, workload, submit, metrics };

let routeGen = 0;  /* which route() drew last: a page whose data comes after a newer route stops */
async function route() {
  routeGen++;
  clearTimers();
  const [page, ...rest] = (location.hash.replace(/^#\/?/, "").split("?")[0] || "overview").split("/");
  const authed = !!store.getItem(TOKEN_KEY);
  document.getElementById("logout").hidden = !authed;
  document.getElementById("nav").hidden = !authed;
  if (!authed && page !== "login") { location.hash = "#/login"; return; }
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.page === page || (page === "workload" && a.dataset.page === "workloads"));
  }
  const fn = pages[page] || overview;
  const titles = { login: "Log in", overview: "Overview", gpus: "GPUs", projects: "Projects", workloads: "Workloads", workload: "Workload", submit: "Submit", metrics: "Metrics" };
  document.title = `${titles[page] || "Overview"} · tessera`;
  put(main, h("p", { class: "muted" }, "Loading…"));
  try { await fn(...rest); } catch (e) {
    if (e.status === 0) put(main, h("h1", {}, "The server cannot be reached"), h("p", { class: "muted" }, "The page is drawn as soon as it answers again."));
    else if (e.status !== 401) put(main, h("h1", {}, "Something went wrong"), h("p", { class: "err" }, e.message));
  }
  main.focus({ preventScroll: true });
}

async function login() {
  const err = h("p", { class: "err", id: "login-error" });
  const token = h("textarea", { id: "token", rows: 3, placeholder: "a token from tessera login, or leave empty" });
  const cid = h("input", { id: "client-id", autocomplete: "username" });
  const secret = h("input", { id: "client-secret", type: "password", autocomplete: "current-password" });
  const form = h("form", { class: "panel login", onsubmit: async (ev) => {
    ev.preventDefault(); err.textContent = "";
    try {
      let value = token.value.trim();
      if (!value) {
        const r = await api("/api/v1/token", { method: "POST", login: true,
          body: { grantType: "client_credentials", clientId: cid.value, clientSecret: secret.value } });
        value = r.accessToken;
      }
      store.setItem(TOKEN_KEY, value);
      await api("/api/v1/overview", { login: true });
      location.hash = "#/overview";
    } catch (e) { store.removeItem(TOKEN_KEY); err.textContent = e.status === 401 ? "Wrong token or credentials." : e.message; }
  } },
    h("h1", {}, "Log in to tessera"),
    h("label", {}, "Token", token),
    h("p", { class: "muted" }, "or the client credentials (tessera's data directory keeps them in credentials.json):"),
    h("label", {}, "Client id", cid), h("label", {}, "Client secret", secret),
    h("div", { class: "row", style: { marginTop: "12px" } }, h("button", { class: "btn", type: "submit", id: "login-button" }, "Log in")),
    err);
  put(main, form);
  token.focus();
}

function phaseBadge(phase) { return h("span", { class: `badge ${phase}` }, phase); }

/* Pending workloads by the kind of their wait: quota (a project's share or limit), room (no GPU
   or node fits now), or anything else. */
function waitClass(message) {
  const m = String(message || "");
  if (/fair share|quota|limit|deserved/i.test(m)) return "quota";
  if (/no GPU with|no node|idle GPU|room|fits|free/i.test(m)) return "room";
  return "other";
}
/* A one-line SVG chart of the last hour (allocated GPUs against the total). */
function sparkline(times, values, total) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 200 40"); svg.setAttribute("class", "spark"); svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  let pts = values.map((v, i) => [times[i], v]).filter(([, v]) => v !== null && v !== undefined);
  if (pts.length === 1) pts = [[pts[0][0] - 1, pts[0][1]], pts[0]];  /* one sample: a level line */
  const top = Math.max(total || 0, ...pts.map(([, v]) => v), 1e-9);
  const t0 = times[0], t1 = times[times.length - 1] || t0 + 1;
  if (pts.length > 1) {
    const line = document.createElementNS(ns, "polyline");
    const a = Math.min(t0, pts[0][0]), span = Math.max(t1 - a, 1e-9);
    line.setAttribute("points", pts.map(([t, v]) => `${(200 * (t - a)) / span},${38 - (36 * v) / top}`).join(" "));
    line.setAttribute("fill", "none"); line.setAttribute("stroke", "#2f6fed"); line.setAttribute("stroke-width", "1.5");
    svg.append(line);
  }
  svg.setAttribute("aria-label", pts.length ? `GPUs allocated over the last hour: from ${fmtGpus(pts[0][1])} to ${fmtGpus(pts[pts.length - 1][1])} of ${fmtGpus(total)}` : "no samples yet");
  return svg;
}
/* Capacity per GPU model: GPUs, memory allocated, whole GPUs idle, and the largest free slot. */
function capacity(c) {
  const by = new Map();
  for (const n of c.nodes || []) {
    for (const g of n.gpus || []) {
      const m = by.get(g.model) || { model: g.model, gpus: 0, total: 0, alloc: 0, idle: 0, free: 0, where: "" };
      const usable = g.memoryBytes - (g.headroomBytes || 0);
      const held = (g.workloads || []).some((w) => w.exclusive) ? usable : g.allocatedBytes;
      m.gpus++; m.total += usable; m.alloc += held;
      if (!(g.workloads || []).length) m.idle++;
      if (usable - held > m.free) { m.free = usable - held; m.where = `${n.name} GPU ${g.index}`; }
      by.set(g.model, m);
    }
    for (const g of n.migGpus || []) {
      const m = by.get(`${g.model} (MIG)`) || { model: `${g.model} (MIG)`, gpus: 0, total: null, alloc: null, idle: 0, free: null, where: "" };
      m.gpus++; by.set(m.model, m);
    }
  }
  return [...by.values()].sort((a, b) => a.model.localeCompare(b.model));
}

async function overview() {
  const draw = async () => {
    const [o, pending, hist, c] = await Promise.all([api("/api/v1/overview"),
      api("/api/v1/workloads?limit=500&shape=rows&fields=workloadId,name,projectName,type,phaseMessage&filterBy=phase%3D%3DPending"),
      api("/api/v1/metrics/history?minutes=60").catch(() => null), api("/api/v1/cluster").catch(() => null)]);
    document.getElementById("sim").hidden = !o.simulated;
    const g = o.gpus;
    const cards = h("div", { class: "cards" },
      card(fmtGpus(g.allocated), `of ${fmtGpus(g.total)} GPUs allocated`, "card-allocated"),
      card(fmtGpus(g.free), "GPUs free", "card-free"),
      card(fmtBytes(g.memoryAllocatedBytes), `of ${fmtBytes(g.memoryTotalBytes)} GPU memory allocated`),
      card(fmtBytes(g.memoryLoanedBytes), "GPU memory on loan", "card-loaned"),
      g.memoryUsedBytes === null || g.memoryUsedBytes === undefined ? null
        : card(fmtBytes(g.memoryUsedBytes), `GPU memory in use; ${fmtGpus(g.busy)} GPUs' worth busy`, "card-used"));
    const ORDER = ["Pending", "Running", "Stopping", "Stopped", "Completed", "Failed"];
    const phases = h("div", { class: "row" }, Object.entries(o.workloadsByPhase).sort((a, b) => ORDER.indexOf(a[0]) - ORDER.indexOf(b[0])).map(([p, n]) =>
      h("a", { href: `#/workloads?phase=${p}`, class: `badge ${p}` }, `${p} ${n}`)));
    const scale = Math.max(1, ...o.projects.map((p) => Math.max(p.fairShare, p.deserved, p.allocated)));
    const rows = o.projects.map((p) => h("tr", {},
      h("td", {}, p.name),
      h("td", {}, h("span", { class: `badge ${p.state}` }, p.state === "over" ? "over fair share" : p.state === "under" ? "under fair share" : "at fair share")),
      h("td", {}, fmtGpus(p.allocated)), h("td", {}, fmtGpus(p.fairShare)), h("td", { class: "opt" }, fmtGpus(p.deserved)),
      h("td", {}, shareBar(p.allocated, scale, p.fairShare, p.name))));
    const groups = { quota: [], room: [], other: [] };
    for (const [wid, name, proj, type, msg] of pending.rows) groups[waitClass(msg)].push({ wid, name, proj, type, msg });
    const LABEL = { quota: "waiting for quota (a project's fair share or limit)", room: "waiting for room (no GPU or node fits now)", other: "waiting for something else" };
    const waits = Object.entries(groups).filter(([, v]) => v.length).map(([k, v]) => h("div", { class: "waits", "data-wait": k },
      h("strong", {}, `${v.length} ${LABEL[k]}`),
      h("ul", {}, v.slice(0, 5).map((x) => h("li", {}, h("a", { href: `#/workload/${KIND_PATH[x.type]}/${x.wid}` }, x.name), ` (${x.proj}): `, h("span", { class: "muted" }, x.msg || ""))),
        v.length > 5 ? h("li", {}, h("a", { href: "#/workloads?phase=Pending" }, `and ${v.length - 5} more`)) : null)));
    const caps = c ? capacity(c) : [];
    const capTable = h("table", { id: "capacity" }, h("thead", {}, h("tr", {}, ["GPU model", "GPUs", "Memory allocated", "Idle GPUs", "Largest free slot"].map((t) => h("th", {}, t)))),
      h("tbody", {}, caps.map((m) => h("tr", {}, h("td", {}, m.model), h("td", {}, m.gpus),
        h("td", {}, m.total === null ? "MIG partitions (GPUs page)" : `${fmtBytes(m.alloc)} of ${fmtBytes(m.total)}`), h("td", {}, m.idle),
        h("td", {}, m.free === null ? "—" : `${fmtBytes(m.free)}${m.where ? ` on ${m.where}` : ""}`)))));
    const spark = hist && hist.time && hist.time.length ? h("div", { class: "card", id: "card-trend" },
      sparkline(hist.time, hist.allocated, g.total), h("div", { class: "l" }, `GPUs allocated, last hour (of ${fmtGpus(g.total)})`)) : null;
    if (spark) cards.append(spark);
    put(main, h("h1", {}, "Overview"), cards,
      h("h2", {}, "Workloads by phase"), h("div", { class: "panel" }, Object.keys(o.workloadsByPhase).length ? phases : h("span", { class: "muted" }, "No workloads yet.")),
      pending.rows.length ? [h("h2", {}, "Pending, by what they wait for"), h("div", { class: "panel", id: "pending-waits" }, waits)] : null,
      caps.length ? [h("h2", {}, "Capacity by GPU model"), h("div", { class: "panel" }, capTable)] : null,
      h("h2", {}, "Projects and their fair share"),
      h("div", { class: "panel" }, h("table", { id: "overview-projects" },
        h("thead", {}, h("tr", {}, ["Project", "State", "Allocated", "Fair share", "Deserved", ""].map((t, i) => h("th", { class: i === 4 ? "opt" : null }, t)))),
        h("tbody", {}, rows))));
  };
  await draw();
  every(5000, () => draw().catch(() => {}));
}
function card(n, label, id) { return h("div", { class: "card", id }, h("div", { class: "n" }, n), h("div", { class: "l" }, label)); }
function shareBar(value, scale, mark, name) {
  const bar = h("div", { class: "bar", title: `${fmtGpus(value)} GPUs` },
    h("div", { class: "seg", style: { width: `${Math.min(100, (100 * value) / scale)}%`, background: color(name) } }));
  if (mark !== null && mark !== undefined) bar.append(h("div", { class: "mark", title: `fair share ${fmtGpus(mark)}`, style: { left: `${Math.min(100, (100 * mark) / scale)}%` } }));
  return bar;
}

function pct(x) { return x === null || x === undefined ? "—" : `${Math.round(100 * x)}%`; }

/* Compute share (docs/compute-share.md): a share's request and limit of the GPU's time and the
   time the arbiter charged it over the last second; a GPU's line sums them. */
function computeText(w) {
  if (w.computeRequest === undefined || w.computeRequest === null) return "";
  return `; compute request ${fmtGpus(w.computeRequest)}, limit ${fmtGpus(w.computeLimit)}, GPU time ${pct(w.gpuTime1s)} (1 s)`;
}
function gpuTimeLine(g) {
  const timed = g.workloads.filter((w) => w.computeRequest !== undefined && w.computeRequest !== null);
  if (!timed.length) return null;
  const promised = timed.reduce((t, w) => t + w.computeRequest, 0);
  const used = timed.reduce((t, w) => t + (w.gpuTime1s || 0), 0);
  return h("span", { class: "gputime" }, h("br"), `GPU time ${pct(used)} (1 s), ${pct(promised)} promised`);
}

/* Field errors from the API beside the input whose data-field the error names. */
function showErrors(form, e) {
  form.querySelectorAll(".err[data-for]").forEach((x) => { x.textContent = ""; });
  form.querySelectorAll(".invalid").forEach((x) => x.classList.remove("invalid"));
  let placed = false;
  for (const d of e.details || []) {
    const field = String(d.field || "");
    for (const input of form.querySelectorAll("[data-field]")) {
      const key = input.dataset.field;
      if (field === key || field.endsWith(`.${key}`) || field.endsWith(key)) {
        input.classList.add("invalid");
        const slot = form.querySelector(`.err[data-for="${input.id}"]`);
        if (slot) slot.textContent = d.message || e.message;
        placed = true;
      }
    }
  }
  if (!placed) { const general = form.querySelector(".err.general"); if (general) general.textContent = e.message; }
}
function field(label, input, hint) {
  return h("label", {}, label, input, hint ? h("span", { class: "muted" }, hint) : null, h("span", { class: "err", "data-for": input.id }));
}

/* A project's fair share as the scheduler's last cycle computed it (else the overview's), and
   how much of it usage history gave or took (time-based fair share, docs/scheduling.md). */
function fairShareCell(status, fallback) {
  const share = status.fairShare && status.fairShare.gpu !== undefined ? status.fairShare.gpu : fallback;
  const hist = (status.fromUsageHistory || {}).gpu || 0;
  const note = Math.abs(hist) < 0.005 ? null : h("div", { class: "muted", "data-col": "from-history" },
    hist > 0 ? `of which ${fmtGpus(hist)} from usage history` : `${fmtGpus(-hist)} less due to usage history`);
  return [fmtGpus(share), note];
}

/* Projects: quota, what each holds and asks for, what waits, its fair share, on one scale for
   every row (deserved as the bar's mark); refreshed every 5 s without touching the forms. */
async function projects() {
  const body = h("tbody", {});
  const note = h("p", { class: "badge warn", id: "quota-note", hidden: true });
  const draw = async () => {
    const [list, over, waiting] = await Promise.all([api("/api/v1/org-unit/projects"), api("/api/v1/overview"),
      api("/api/v1/workloads?limit=10000&shape=rows&fields=projectName&filterBy=phase%3D%3DPending")]);
    const byName = Object.fromEntries(over.projects.map((p) => [p.name, p]));
    const pending = {};
    for (const [project] of waiting.rows) pending[project] = (pending[project] || 0) + 1;
    const scale = Math.max(1, ...list.projects.map((p) => { const o = byName[p.name] || {};
      return Math.max(p.resources.gpu.deserved || 0, o.fairShare || 0, p.status.allocated.gpu || 0, o.requested || 0); }));
    const deserved = list.projects.reduce((t, p) => t + Math.max(0, p.resources.gpu.deserved || 0), 0);
    note.hidden = !(deserved > over.gpus.total + 1e-9);
    note.textContent = `The projects' deserved quotas add up to ${fmtGpus(deserved)} GPUs on ${fmtGpus(over.gpus.total)}: they cannot all have their deserved share at once (each gets its fair share instead).`;
    body.replaceChildren(...list.projects.map((p) => {
      const q = p.resources.gpu; const o = byName[p.name] || {};
      return h("tr", { "data-project": p.name },
        h("td", {}, h("strong", {}, p.name)), h("td", { class: "num" }, fmtGpus(q.deserved)), h("td", { class: "num" }, q.limit === null || q.limit === undefined ? "none" : fmtGpus(q.limit)),
        h("td", { class: "opt num" }, fmtGpus(q.overQuotaWeight)), h("td", { class: "opt num" }, p.priority),
        h("td", { class: "num", "data-col": "allocated" }, fmtGpus(p.status.allocated.gpu)), h("td", { class: "num", "data-col": "requested" }, fmtGpus(o.requested)),
        h("td", { class: "num", "data-col": "pending" }, pending[p.name] ? h("a", { href: `#/workloads?phase=Pending&project=${encodeURIComponent(p.name)}` }, String(pending[p.name])) : "0"),
        h("td", { class: "num", "data-col": "fair-share" }, fairShareCell(p.status, o.fairShare)),
        h("td", {}, shareBar(p.status.allocated.gpu, scale, q.deserved, p.name)),
        h("td", {}, h("div", { class: "row" },
          h("button", { class: "btn secondary", type: "button", "data-edit": p.name, onclick: () => editProject(p) }, "Edit"),
          h("button", { class: "btn danger", type: "button", "data-delete": p.name, onclick: () => deleteProject(p.name, draw) }, "Delete"))));
    }));
  };
  await draw();
  put(main, h("h1", {}, "Projects"), note,
    h("div", { class: "panel" }, h("table", { id: "projects" },
      h("thead", {}, h("tr", {}, ["Project", "Deserved", "Limit", "Weight", "Priority", "Allocated", "Requested", "Pending", "Fair share", "", ""].map((t, i) => h("th", { class: i === 3 || i === 4 ? "opt" : null }, t)))),
      body)),
    h("p", { class: "muted" }, "The bars share one scale; the dark mark is the project's deserved quota."),
    h("div", { id: "project-editor" }), projectForm(null));
  every(5000, () => draw().catch(() => {}));
}
async function deleteProject(name, redraw) {
  if (!window.confirm(`Delete project ${name}? Its access rules go with it.`)) return;
  try {
    await api(`/api/v1/org-unit/projects/${encodeURIComponent(name)}`, { method: "DELETE" });
    toast(`Project ${name} deleted.`);
    await redraw();
  } catch (e) { toast(e.message); }
}
function projectForm(p) {
  const q = p ? p.resources.gpu : {};
  const name = h("input", { id: "p-name", "data-field": "name", value: p ? p.name : "", disabled: !!p, required: true });
  const deserved = h("input", { id: "p-deserved", "data-field": "deserved", value: p ? q.deserved : "1", inputmode: "decimal" });
  const limit = h("input", { id: "p-limit", "data-field": "limit", value: p && q.limit !== null && q.limit !== undefined ? q.limit : "", placeholder: "none", inputmode: "decimal" });
  const weight = h("input", { id: "p-weight", "data-field": "overQuotaWeight", value: p ? q.overQuotaWeight : "1", inputmode: "decimal" });
  const priority = h("input", { id: "p-priority", "data-field": "priority", value: p ? p.priority : "50", inputmode: "numeric" });
  const initial = { deserved: deserved.value, limit: limit.value, overQuotaWeight: weight.value, priority: priority.value };
  const num = (v) => (v === "" ? null : Number.isNaN(Number(v)) ? v : Number(v));
  const form = h("form", { class: "panel", id: p ? "edit-project" : "create-project", onsubmit: async (ev) => {
    ev.preventDefault();
    try {
      if (p) {
        /* a partial update: only what changed is sent */
        const gpu = {}; const body = {};
        if (deserved.value !== String(initial.deserved)) gpu.deserved = num(deserved.value);
        if (limit.value !== String(initial.limit)) gpu.limit = num(limit.value);
        if (weight.value !== String(initial.overQuotaWeight)) gpu.overQuotaWeight = num(weight.value);
        if (Object.keys(gpu).length) body.resources = { gpu };
        if (priority.value !== String(initial.priority)) body.priority = num(priority.value);
        if (!Object.keys(body).length) { toast("Nothing changed."); return; }
        await api(`/api/v1/org-unit/projects/${encodeURIComponent(p.name)}`, { method: "PATCH", body });
        toast(`Project ${p.name} updated.`);
      } else {
        const gpu = { deserved: num(deserved.value), overQuotaWeight: num(weight.value) };
        if (limit.value !== "") gpu.limit = num(limit.value);
        await api("/api/v1/org-unit/projects", { method: "POST", body: { name: name.value, resources: { gpu }, priority: num(priority.value) } });
        toast(`Project ${name.value} created.`);
      }
      clearTimers(); await projects();
    } catch (e) { showErrors(form, e); }
  } },
    h("h2", { style: { marginTop: 0 } }, p ? `Edit ${p.name}` : "New project"),
    h("div", { class: "grid", style: { display: "grid", gridTemplateColumns: "repeat(auto-fit, minmax(180px, 1fr))", gap: "12px 16px" } },
      field("Name", name), field("Deserved GPUs", deserved), field("Limit (GPUs, empty: none)", limit),
      field("Over-quota weight", weight), field("Priority", priority)),
    h("p", { class: "err general" }),
    h("div", { class: "row" }, h("button", { class: "btn", type: "submit", id: p ? "save-project" : "create-project-button" }, p ? "Save changes" : "Create project"),
      p ? h("button", { class: "btn secondary", type: "button", onclick: () => document.getElementById("project-editor").replaceChildren() }, "Cancel") : null));
  return form;
}
function editProject(p) {
  const slot = document.getElementById("project-editor");
  slot.replaceChildren(projectForm(p));
  slot.querySelector("#p-deserved").focus();
}

async function workloads() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const state = { search: params.get("search") || "", phase: params.get("phase") || "", project: params.get("project") || "", offset: Number(params.get("offset") || 0),
    sort: params.get("sort") || "createdAt", order: params.get("order") || "desc" };
  const limit = 50;
  const projectList = (await api("/api/v1/org-unit/projects")).projects.map((p) => p.name);
  const search = h("input", { id: "w-search", placeholder: "name contains…", value: state.search, "aria-label": "Search by name" });
  const phase = h("select", { id: "w-phase", "aria-label": "Phase" }, h("option", { value: "" }, "any phase"),
    ["Pending", "Running", "Stopping", "Stopped", "Completed", "Failed"].map((p) => h("option", { value: p, selected: p === state.phase }, p)));
  const project = h("select", { id: "w-project", "aria-label": "Project" }, h("option", { value: "" }, "any project"),
    projectList.map((p) => h("option", { value: p, selected: p === state.project }, p)));
  const table = h("tbody");
  const pager = h("div", { class: "row" });
  const go = () => {
    const q = new URLSearchParams();
    if (search.value) q.set("search", search.value);
    if (phase.value) q.set("phase", phase.value);
    if (project.value) q.set("project", project.value);
    if (state.offset) q.set("offset", state.offset);
    if (state.sort !== "createdAt" || state.order !== "desc") { q.set("sort", state.sort); q.set("order", state.order); }
    history.replaceState(null, "", `#/workloads?${q}`);
    load().catch((e) => toast(e.message));
  };
  const load = async () => {
    const q = new URLSearchParams({ limit, offset: state.offset, sortBy: state.sort, sortOrder: state.order, shape: "rows",
      fields: "workloadId,name,projectName,type,phase,gpus,nodeName,gpuDevices,createdAt,phaseMessage,workers,runningPods" });
    if (search.value) q.set("search", search.value);
    if (phase.value) q.append("filterBy", `phase==${phase.value}`);
    if (project.value) q.append("filterBy", `projectName==${project.value}`);
    const r = await api(`/api/v1/workloads?${q}`);
    table.replaceChildren(...r.rows.map(([id, name, proj, type, ph, g, node, devices, created, message, workers, running]) => {
      const href = `#/workload/${KIND_PATH[type]}/${id}`;
      const pending = ph === "Pending" ? Math.max(0, (workers || 1) - (running || 0)) : 0;
      return h("tr", { class: "click", tabindex: 0, "data-workload": name,
        onclick: (ev) => { if (!ev.target.closest("a")) location.hash = href; },
        onkeydown: (ev) => { if (ev.key === "Enter") location.hash = href; } },
        h("td", {}, h("a", { href, class: "rowlink", tabindex: -1 }, h("strong", {}, name))), h("td", {}, proj), h("td", { class: "opt" }, type), h("td", {}, phaseBadge(ph)),
        h("td", { class: "reason", title: ph === "Pending" ? message || "" : "" }, ph === "Pending" ? message || "" : ""),
        h("td", {}, g ? g.request : ""), h("td", { class: "num" }, g ? `${fmtGpus(g.allocated)} / ${fmtGpus(g.requested)}` : "—"),
        h("td", { class: "num" }, `${running || 0} / ${pending}`),
        h("td", { class: "opt" }, node ? `${node}${devices ? ` / ${devices}` : ""}` : "—"), h("td", { class: "opt" }, age(created)));
    }));
    if (!r.rows.length) table.replaceChildren(h("tr", {}, h("td", { colspan: 10, class: "muted" }, "No workloads match.")));
    pager.replaceChildren(h("span", { class: "muted", id: "w-count" }, `${r.total ? state.offset + 1 : 0}–${state.offset + r.rows.length} of ${r.total}`), h("span", { class: "spacer" }),
      h("button", { class: "btn secondary", type: "button", disabled: state.offset === 0, onclick: () => { state.offset = Math.max(0, state.offset - limit); go(); } }, "Previous"),
      h("button", { class: "btn secondary", type: "button", disabled: r.next === null, onclick: () => { state.offset = r.next; go(); } }, "Next"));
  };
  /* Column heads: those the API sorts by are buttons (ascending, then descending). */
  const cols = [["Name", "name"], ["Project", "projectName"], ["Type", "type", "opt"], ["Status", "phase"], ["Why pending"], ["GPU request"],
    ["GPUs alloc. / req."], ["Pods run. / pend."], ["Node / GPU", null, "opt"], ["Age", "createdAt", "opt"]];
  const heads = cols.map(([label, key, cls]) => {
    if (!key) return h("th", { class: cls || null }, label);
    const on = state.sort === key;
    return h("th", { class: cls || null, "aria-sort": on ? (state.order === "asc" ? "ascending" : "descending") : "none" },
      h("button", { class: "sort", type: "button", "data-sort": key, onclick: () => {
        state.order = on && state.order === "asc" ? "desc" : on ? "asc" : key === "createdAt" ? "desc" : "asc";
        state.sort = key; state.offset = 0; go(); route();  /* drawn again from the URL, heads included */
      } }, label, on ? (state.order === "asc" ? " ▲" : " ▼") : ""));
  });
  let debounce;
  search.addEventListener("input", () => { clearTimeout(debounce); debounce = setTimeout(() => { state.offset = 0; go(); }, 250); });
  phase.addEventListener("change", () => { state.offset = 0; go(); });
  project.addEventListener("change", () => { state.offset = 0; go(); });
  put(main, h("div", { class: "row" }, h("h1", {}, "Workloads"), h("span", { class: "spacer" }), h("a", { class: "btn", href: "#/submit", style: { textDecoration: "none" } }, "Submit a workload")),
    h("div", { class: "row panel" }, search, phase, project),
    h("div", { class: "panel" }, h("table", { id: "workloads" }, h("thead", {}, h("tr", {}, heads)), table), pager));
  await load();
  every(3000, () => load().catch(() => {}));
}

/* Local date and time of an ISO timestamp, with its zone, as every time on the page reads. */
function when(iso) { return iso ? new Date(iso).toLocaleString([], { timeZoneName: "short" }) : "—"; }
function fmtDuration(sec) {
  sec = Math.max(0, Math.round(sec));
  const d = Math.floor(sec / 86400), hh = Math.floor((sec % 86400) / 3600), mm = Math.floor((sec % 3600) / 60), ss = sec % 60;
  return d ? `${d}d ${hh}h` : hh ? `${hh}h ${mm}m` : mm ? `${mm}m ${ss}s` : `${ss}s`;
}
/* Write only what changed, so focus, a selection and scroll positions survive a refresh. */
function setText(el, text) { if (el.textContent !== text) el.textContent = text; }
function setKids(el, key, build) { if (el.dataset.key !== key) { el.dataset.key = key; el.replaceChildren(...h("div", {}, build()).childNodes); } }

/* A workload: drawn once, then updated in place every 4 s (values, pods, events); the log of the
   chosen pod follows its end only while the reader is at the end. */
async function workload(kind, id) {
  const base = `/api/v1/workloads/${kind}/${id}`;
  let w = null; let pod = 0; let offset = 0;
  const log = h("pre", { class: "log", id: "log", "aria-live": "off", tabindex: 0 });
  const podPick = h("select", { id: "log-pod", "aria-label": "Pod whose log is shown" });
  const tail = async () => {
    const r = await api(`${base}/logs?pod=${pod}&offset=${offset}`, { text: true });
    if (r.text) {
      const atEnd = log.scrollHeight - log.scrollTop - log.clientHeight < 24;
      log.append(r.text);
      if (atEnd) log.scrollTop = log.scrollHeight;
    }
    offset = Number(r.next || offset);
  };
  podPick.addEventListener("change", () => { pod = Number(podPick.value); offset = 0; log.replaceChildren(); tail().catch(() => {}); });
  const act = (verb, label, cls) => h("button", { class: `btn ${cls || "secondary"}`, type: "button", id: `w-${verb}`, hidden: true, onclick: async () => {
    if (verb === "delete" && !confirm(`Delete ${w.name}? Its pods are stopped.`)) return;
    try {
      if (verb === "delete") { await api(base, { method: "DELETE" }); toast(`${w.name} deleted.`); location.hash = "#/workloads"; return; }
      await api(`${base}/${verb}`, { method: "POST" }); toast(`${w.name}: ${verb} requested.`); await draw();
    } catch (e) { toast(e.message); }
  } }, label);
  const buttons = { suspend: act("suspend", "Suspend"), resume: act("resume", "Resume"), delete: act("delete", "Delete", "danger") };
  const title = h("h1", { id: "w-name" });
  const badge = h("span", { class: "badge", id: "w-phase" });
  const why = h("div", { class: "panel", id: "why-pending", hidden: true });
  const failure = h("div", { class: "panel failure", id: "w-failure", hidden: true });
  const kv = {};
  const fields = [["project", "Project"], ["type", "Type"], ["request", "GPU request"], ["allocated", "GPUs allocated"],
    ["placement", "Placement"], ["compute", "Compute share"], ["usage", "GPU use now"], ["urls", "Service URL"], ["command", "Image / command"],
    ["created", "Created"], ["started", "Started"], ["duration", "Duration"], ["exit", "Exit code"]];
  const dl = h("dl", { class: "kv" }, fields.flatMap(([k, label]) => { kv[k] = h("dd", { id: `w-${k}` }); return [h("dt", {}, label), kv[k]]; }));
  const pods = h("tbody", { id: "w-pods" });
  const events = h("tbody");
  put(main,
    h("div", { class: "row" }, title, badge, h("span", { class: "spacer" }), buttons.suspend, buttons.resume, buttons.delete),
    why, failure, h("div", { class: "panel" }, dl),
    h("h2", {}, "Members"), h("div", { class: "panel" }, h("table", { id: "w-members" }, h("thead", {}, h("tr", {}, ["#", "Pod", "Role", "Phase", "Node", "GPUs", "Exit code"].map((t) => h("th", {}, t)))), pods)),
    h("h2", {}, "Events"), h("div", { class: "panel" }, h("table", { id: "events" }, events)),
    h("div", { class: "row" }, h("h2", {}, "Log (live)"), podPick), log);
  const usageOf = async (doc) => {
    if (doc.phase !== "Running") return "—";
    const c = await api("/api/v1/cluster").catch(() => null);
    if (!c) return "—";
    let used = 0, loan = 0, busy = 0, known = false, busyKnown = false;
    for (const n of c.nodes) for (const g of n.gpus) for (const s of g.workloads) {
      if (s.name !== doc.name || (s.project && s.project !== doc.projectName)) continue;
      if (s.usedBytes !== undefined && s.usedBytes !== null) { used += s.usedBytes; known = true; }
      loan += s.loanedBytes || 0;
      if (s.utilization !== undefined && s.utilization !== null) { busy += s.utilization; busyKnown = true; }
    }
    if (!known && !loan) return c.simulated ? "simulated GPUs: no usage to read" : "no usage reported";
    return [known ? `${fmtBytes(used)} used` : null, loan ? `${fmtBytes(loan)} on loan` : null, busyKnown ? `${pct(busy)} busy` : null].filter(Boolean).join(", ");
  };
  const draw = async () => {
    w = await api(base);
    const usage = await usageOf(w);
    document.title = `${w.name} · tessera`;
    setText(title, w.name);
    badge.className = `badge ${w.phase}`; setText(badge, w.phase);
    buttons.suspend.hidden = !["Pending", "Running"].includes(w.phase);
    buttons.resume.hidden = w.phase !== "Stopped";
    buttons.delete.hidden = false;
    why.hidden = !(w.phase === "Pending" && w.phaseMessage);
    setKids(why, `${w.phase}|${w.phaseMessage}`, () => [h("strong", {}, "Why pending: "), w.phaseMessage || ""]);
    failure.hidden = w.phase !== "Failed";
    setKids(failure, `${w.phase}|${w.exitCode}|${w.phaseMessage}`, () => [h("strong", {}, `Failed${w.exitCode !== null && w.exitCode !== undefined ? ` with exit code ${w.exitCode}` : ""}: `), w.phaseMessage || "no message"]);
    setText(kv.project, w.projectName);
    setText(kv.type, workloadTypeText(w));
    setText(kv.request, w.gpus ? w.gpus.request : "—");
    setText(kv.allocated, w.gpus ? `${fmtGpus(w.gpus.allocated)} of ${fmtGpus(w.gpus.requested)}` : "—");
    setText(kv.placement, w.nodeName ? `${w.nodeName}: ${(w.pods || []).map((p) => p.gpuPlacement).filter(Boolean).join("; ") || "no GPU"}` : "not placed");
    setText(kv.usage, usage);
    const cs = w.computeShare;
    setText(kv.compute, cs ? `request ${cs.gpuComputeRequest}, limit ${cs.gpuComputeLimit} (${cs.gpuComputeMode})`
      + (cs.gpus || []).map((g) => `; GPU time ${pct(g.gpuTime1s)} (1 s), ${pct(g.gpuTime10s)} (10 s)${g.enforced ? "" : ", not enforced: multi-GPU"}`).join("")
      + (cs.status ? `; ${cs.status}` : "") : "—");
    setKids(kv.urls, JSON.stringify(w.serviceUrls || []), () => (w.serviceUrls || []).length
      ? w.serviceUrls.flatMap((u, i) => [i ? ", " : "", h("a", { href: u, target: "_blank", rel: "noopener" }, u)]) : "—");
    setText(kv.command, [w.image, w.spec && w.spec.command ? `${w.spec.command} ${w.spec.args || ""}`.trim() : ""].filter(Boolean).join(" — ") || "—");
    setText(kv.created, `${when(w.createdAt)} (${age(w.createdAt)} ago)`);
    setText(kv.started, w.startedAt ? when(w.startedAt) : "not started yet");
    setText(kv.duration, w.startedAt ? fmtDuration(((w.completedAt ? Date.parse(w.completedAt) : Date.now()) - Date.parse(w.startedAt)) / 1000) + (w.completedAt ? "" : " so far") : "—");
    setText(kv.exit, w.exitCode === null || w.exitCode === undefined ? "—" : String(w.exitCode));
    const podRows = memberRows(w);
    setKids(pods, JSON.stringify(podRows), () => podRows.length ? podRows.map((r) => h("tr", {}, r.map((x) => h("td", {}, x))))
      : h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No pods yet: the workload has not started.")));
    setKids(podPick, JSON.stringify(podRows.map((r) => r[0])), () => (podRows.length ? podRows : [[0]]).map((r) => h("option", { value: r[0], selected: r[0] === pod }, `pod ${r[0]}`)));
    const ev = (w.events || []).slice(-30).reverse();
    setKids(events, JSON.stringify(ev), () => ev.length ? ev.map((e) => h("tr", {}, h("td", { class: "opt" }, when(e.time)), h("td", {}, e.kind || e.reason || ""), h("td", { style: { whiteSpace: "normal" } }, e.message || "")))
      : h("tr", {}, h("td", { class: "muted" }, "No events.")));
  };
  await draw();
  await tail().catch(() => {});
  every(1000, () => tail().catch(() => {}));
  every(4000, () => draw().catch(() => {}));
}

async function submit() {
  const [projectsDoc, clusterDoc] = await Promise.all([api("/api/v1/org-unit/projects"), api("/api/v1/cluster").catch(() => null)]);
  const projectList = projectsDoc.projects.map((p) => p.name);
  const anyMig = !!clusterDoc && clusterDoc.nodes.some((n) => (n.migGpus || []).length);
  const kind = h("select", { id: "s-kind", "data-field": "type" }, h("option", { value: "trainings" }, "Training"), h("option", { value: "workspaces" }, "Workspace"), h("option", { value: "inferences" }, "Inference"));
  const name = h("input", { id: "s-name", "data-field": "name", required: true, placeholder: "frac05" });
  const project = h("select", { id: "s-project", "data-field": "projectId" }, projectList.map((p) => h("option", { value: p }, p)));
  const mode = h("select", { id: "s-mode", "aria-label": "GPU request" }, h("option", { value: "portion" }, "a portion of a GPU"), h("option", { value: "memory" }, "GPU memory"), h("option", { value: "whole" }, "whole GPUs"), anyMig ? h("option", { value: "mig" }, "a MIG partition") : null, h("option", { value: "none" }, "no GPU"));
  const portion = h("input", { id: "s-portion", "data-field": "gpuPortionRequest", value: "0.5", inputmode: "decimal" });
  const portionLimit = h("input", { id: "s-portion-limit", "data-field": "gpuPortionLimit", placeholder: "same as request", inputmode: "decimal" });
  const memory = h("input", { id: "s-memory", "data-field": "gpuMemoryRequest", placeholder: "5G or 4Gi" });
  const memoryLimit = h("input", { id: "s-memory-limit", "data-field": "gpuMemoryLimit", placeholder: "same as request" });
  const devices = h("input", { id: "s-devices", "data-field": "gpuDevicesRequest", value: "1", inputmode: "numeric" });
  const migProfile = h("input", { id: "s-mig-profile", "data-field": "gpuMigProfile", placeholder: "3g.20gb" });
  const image = h("input", { id: "s-image", "data-field": "image", placeholder: "optional" });
  const command = h("input", { id: "s-command", "data-field": "command", placeholder: "python3" });
  const args = h("input", { id: "s-args", "data-field": "args", placeholder: "train.py --epochs 3" });
  const workers = h("input", { id: "s-workers", "data-field": "workers", value: "1", inputmode: "numeric" });
  const workdir = h("input", { id: "s-workdir", "data-field": "workingDir", placeholder: "the server's choice" });
  const envs = h("textarea", { id: "s-env", "data-field": "environmentVariables", rows: 2, placeholder: "NAME=value, one a line" });
  const groups = { portion: [portion, portionLimit], memory: [memory, memoryLimit], whole: [], mig: [migProfile], none: [] };
  const sync = () => { for (const [m, inputs] of Object.entries(groups)) for (const i of inputs) i.closest("label").hidden = m !== mode.value; devices.closest("label").hidden = mode.value === "none" || mode.value === "mig"; };
  mode.addEventListener("change", sync);
  const num = (v) => (v === "" ? undefined : Number.isNaN(Number(v)) ? v : Number(v));
  const form = h("form", { class: "panel", id: "submit-form", onsubmit: async (ev) => {
    ev.preventDefault();
    const compute = {};
    if (mode.value === "portion") { compute.gpuRequestType = "portion"; compute.gpuPortionRequest = num(portion.value); if (portionLimit.value) compute.gpuPortionLimit = num(portionLimit.value); compute.gpuDevicesRequest = num(devices.value); }
    if (mode.value === "memory") { compute.gpuRequestType = "memory"; compute.gpuMemoryRequest = memory.value; if (memoryLimit.value) compute.gpuMemoryLimit = memoryLimit.value; compute.gpuDevicesRequest = num(devices.value); }
    if (mode.value === "whole") compute.gpuDevicesRequest = num(devices.value);
    if (mode.value === "mig") compute.gpuMigProfile = migProfile.value;
    const spec = { compute, image: image.value, command: command.value, args: args.value, workers: num(workers.value) };
    if (workdir.value) spec.workingDir = workdir.value;
    const lines = envs.value.split("\n").map((l) => l.trim()).filter(Boolean);
    if (lines.length) spec.environmentVariables = lines.map((l) => ({ name: l.split("=")[0], value: l.includes("=") ? l.slice(l.indexOf("=") + 1) : "" }));
    const body = { name: name.value, projectId: project.value, spec };
    try {
      const r = await api(`/api/v1/workloads/${kind.value}`, { method: "POST", body });
      toast(`${name.value} submitted.`);
      location.hash = `#/workload/${kind.value}/${r.workloadId}`;
    } catch (e) { showErrors(form, e); }
  } },
    h("div", { class: "grid", style: { display: "grid", gridTemplateColumns: "repeat(auto-fit, minmax(200px, 1fr))", gap: "12px 16px" } },
      field("Kind", kind), field("Name", name), field("Project", project), field("GPU", mode),
      field("Portion (0–1)", portion), field("Portion limit (burst)", portionLimit),
      field("GPU memory", memory), field("GPU memory limit (burst)", memoryLimit),
      field("GPUs (devices)", devices), field("MIG profile", migProfile, "e.g. 1g.5gb, 3g.20gb: on GPUs in MIG mode"), field("Image", image, "with no command, its entrypoint runs"),
      field("Command", command), field("Arguments", args),
      field("Workers (pods)", workers), field("Working directory", workdir, "on this machine, for a command"), field("Environment", envs)),
    h("p", { class: "err general" }),
    h("div", { class: "row" }, h("button", { class: "btn", type: "submit", id: "submit-button" }, "Submit")));
  put(main, h("h1", {}, "Submit a workload"), form);
  sync();
  name.focus();
}

/* uPlot (the charts) is loaded by the Metrics page only: the other pages do not wait for it. */
function needUplot() {
  if (window.uPlot) return Promise.resolve();
  return needUplot.loading || (needUplot.loading = new Promise((resolve, reject) => {
    const src = document.querySelector('meta[name="tessera-uplot"]').content;
    document.head.append(h("script", { src, onload: resolve, onerror: () => { needUplot.loading = null; reject(new ApiError(0, { message: "the chart library did not load" })); } }));
  }));
}
async function metrics() {
  await needUplot();
  const minutes = h("select", { id: "m-minutes", "aria-label": "Time range" }, [15, 60, 180, 360, 1440].map((m) => h("option", { value: m, selected: m === 60 }, m < 60 ? `last ${m} min` : `last ${m / 60} h`)));
  const byProject = h("div", { class: "chart", id: "chart-projects" });
  const byWorkload = h("div", { class: "chart", id: "chart-workloads" });
  const utilProject = h("div", { class: "chart", id: "chart-util-projects" });
  const utilWorkload = h("div", { class: "chart", id: "chart-util-workloads" });
  const utilNote = h("p", { class: "muted", id: "util-note" });
  const memProject = h("div", { class: "chart", id: "chart-memory-projects" });
  const memPanel = h("div", { class: "panel", id: "panel-memory" }, h("h2", { style: { marginTop: 0 } }, "GPU memory used, by project"), memProject);
  const utilPanels = [h("div", { class: "panel" }, h("h2", { style: { marginTop: 0 } }, "GPU utilisation, by project"), utilProject),
    h("div", { class: "panel" }, h("h2", { style: { marginTop: 0 } }, "GPU utilisation, by workload (busiest 10)"), utilWorkload)];
  const sourceNote = h("p", { class: "muted", id: "source-note" });
  put(main, h("div", { class: "row" }, h("h1", {}, "Metrics"), h("span", { class: "spacer" }), minutes),
    sourceNote,
    h("div", { class: "panel" }, h("h2", { style: { marginTop: 0 } }, "GPUs allocated, by project (stacked; the dashed line is the capacity)"), byProject),
    h("div", { class: "panel" }, h("h2", { style: { marginTop: 0 } }, "GPUs allocated, by workload (largest 10)"), byWorkload),
    utilNote, ...utilPanels, memPanel);
  const plots = [];
  const peak = (v) => Math.max(0, ...v.map((x) => x || 0));
  const draw = async () => {
    const d = await api(`/api/v1/metrics/history?minutes=${minutes.value}`);
    plots.forEach((p) => p.destroy()); plots.length = 0;
    const whence = d.source === "prometheus" ? "From Prometheus (TESSERA_PROMETHEUS_URL)." : `From samples the server keeps (the last ${d.retentionHours} h; Prometheus, when configured, keeps more).${d.note ? " " + d.note + "." : ""}`;
    sourceNote.textContent = `${whence} Utilisation is in GPUs' worth: a workload keeping 40% of one GPU busy counts 0.4.`;
    if (d.source !== "prometheus") for (const o of [...minutes.options]) if (Number(o.value) > d.retentionHours * 60) o.remove();
    const width = Math.max(300, main.clientWidth - 60);
    const now = Date.now() / 1000;
    const x = { time: true, min: now - Number(minutes.value) * 60, max: now };  /* the window chosen, not the data's span */
    const series = (names) => [{}, ...names.map((n) => ({ label: n, stroke: n === "all" ? "#151a24" : color(n), width: 2, spanGaps: true }))];
    const chart = (el, names, columns, label, extra) => {
      const opts = { width, height: 260, series: series(names), axes: [{}, { label, size: 60 }], scales: { x } };
      if (extra) extra(opts);
      plots.push(new uPlot(opts, [d.time, ...columns], el));
      el.dataset.points = String(d.time.length);
      el.dataset.values = String(columns.flat().filter((x) => x !== null && x !== undefined && x > 0).length);
    };
    /* Stacked: each project's band is drawn from the sum of those below it (uPlot fills down to
       zero, so the largest sum is drawn first); the legend shows each project's own value. */
    const projectNames = Object.keys(d.projects);
    const sums = []; let acc = d.time.map(() => 0);
    for (const p of projectNames) { acc = acc.map((v, i) => v + (d.projects[p][i] || 0)); sums.push(acc); }
    chart(byProject, ["capacity", ...[...projectNames].reverse()], [d.total, ...[...sums].reverse()], "GPUs", (opts) => {
      opts.series[1] = { label: "capacity", stroke: "#151a24", width: 1.5, dash: [6, 4], spanGaps: true };
      projectNames.slice().reverse().forEach((p, k) => {
        const raw = d.projects[p];
        opts.series[k + 2] = { label: p, stroke: color(p), fill: `${color(p)}cc`, width: 1, spanGaps: true,
          value: (u, v, si, i) => (i === null || i === undefined || raw[i] === null || raw[i] === undefined ? "—" : fmtGpus(raw[i])) };
      });
    });
    const top = Object.entries(d.workloads).sort((a, b) => peak(b[1]) - peak(a[1])).slice(0, 10);
    chart(byWorkload, top.map(([n]) => n), top.map(([, v]) => v), "GPUs");
    const u = d.utilization || { all: [], projects: {}, workloads: {} };
    const reported = u.all.some((x) => x !== null && x !== undefined);
    utilNote.textContent = reported ? "" : "GPU utilisation and memory used: none reported in this range (the GPUs are simulated, or no node agent answered; see the GPUs page), so their charts are not drawn.";
    for (const el of [...utilPanels, memPanel]) el.hidden = !reported;
    const usedProjects = Object.keys((d.memoryUsed || {}).projects || {});
    if (reported && usedProjects.length) chart(memProject, usedProjects, usedProjects.map((p) => d.memoryUsed.projects[p].map((v) => (v === null || v === undefined ? null : v / 2 ** 30))), "GiB");
    else memPanel.hidden = true;
    const busyProjects = Object.keys(u.projects);
    chart(utilProject, ["all", ...busyProjects], [u.all, ...busyProjects.map((p) => u.projects[p])], "GPUs busy");
    const busiest = Object.entries(u.workloads).sort((a, b) => peak(b[1]) - peak(a[1])).slice(0, 10);
    chart(utilWorkload, busiest.map(([n]) => n), busiest.map(([, v]) => v), "GPUs busy");
  };
  minutes.addEventListener("change", () => draw().catch((e) => toast(e.message)));
  await draw();
  every(10000, () => draw().catch(() => {}));
}

document.getElementById("logout").addEventListener("click", () => { store.removeItem(TOKEN_KEY); location.hash = "#/login"; });
window.addEventListener("hashchange", route);
/* after every script: gpus.js and tenancy.js add their pages to `pages` */
document.addEventListener("DOMContentLoaded", () => { route(); });
