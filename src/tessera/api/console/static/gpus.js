/* tessera console, the GPUs page (loaded after app.js, whose helpers it uses: h, put, api, color,
   inkOn, fmtBytes, fmtGpus, pct, every; computeText and gpuTimeLine for the compute share).

   Each node is a panel; each GPU a row whose bar is the GPU's memory split into the shares on
   it. At cluster scale (500 nodes x 8 GPUs) the page stays quick by drawing only what is seen:
   - every node's panel is on the page from the first draw, with its name, its agent's state
     and a summary line (GPUs, shares, memory allocated and in use), so the page's length,
     scroll bar, the node filter and the browser's find-in-page see every node;
   - a node's GPU rows are drawn when its panel comes near the window (an IntersectionObserver,
     one screen ahead), until then a box of the rows' height stands in;
   - each refresh (every 5 s) compares every node's data with what was drawn and draws again
     only the nodes that changed *and* are in view (the others when they come into view), so a
     refresh costs a few nodes, not the cluster, and keeps keyboard focus on its segment. */
"use strict";

(function () {
  /* Many small shares: those under SLIVER of the GPU merge into one "+N shares" segment (its
     width their sum, so the bar stays proportional; its details list them). */
  const MAX_SHARES = 10;
  const SLIVER = 0.05;
  let rowHeight = 52;  /* a GPU row's height in px, measured once a node is drawn */
  let measured = false;

  /* The node agent's state on a node: nothing when it reported, else why there are no numbers. */
  function agentNote(n) {
    const a = n.agent || { state: "waiting", message: "" };
    if (a.state === "ok") return h("span", { class: "muted agent", "data-agent-state": "ok", title: a.message || "" }, `usage from tessera-node, ${a.ageSeconds ?? 0}s ago`);
    const what = { unreachable: "node agent not answering", "no-agent": "no node agent", "not-ready": "node agent has no usage",
      waiting: "waiting for the node agent", simulated: "simulated GPUs: no usage to read" }[a.state] || a.state;
    return h("span", { class: `badge ${a.state === "simulated" ? "" : "warn"} agent`, "data-agent-state": a.state, title: a.message || "" },
      `${what}${a.message && a.state !== "simulated" ? `: ${a.message}` : ""}`);
  }

  /* A bar segment: focusable, its details in the GPU row's detail line on focus or hover (and
     as its accessible name), not only in a hover title. `key` finds it again after a redraw. */
  function segment(detail, text, attrs, label, key) {
    const show = () => { detail.textContent = text; };
    const hide = () => { if (detail.textContent === text) detail.textContent = ""; };
    return h("div", { ...attrs, "data-key": key, tabindex: 0, title: text, "aria-label": text, onfocus: show, onblur: hide, onmouseenter: show, onmouseleave: hide }, label);
  }

  function usable(g) { return g.memoryBytes - (g.headroomBytes || 0); }
  function held(g) { return g.workloads.some((w) => w.exclusive) ? usable(g) : g.allocatedBytes; }

  /* One GPU's row: its bar of shares (slivers merged), the memory in use, the numbers. */
  function gpuRow(g, projectOf) {
    const known = g.usedBytes !== undefined;
    const detail = h("div", { class: "segdetail muted", "aria-live": "polite" });
    const shares = g.workloads.map((w) => {
      const project = w.project || projectOf[w.name] || "";
      const bytes = w.exclusive ? usable(g) : w.bytes;
      const usage = w.usedBytes !== undefined && w.usedBytes !== null
        ? `; using ${fmtBytes(w.usedBytes)}${w.utilization !== null && w.utilization !== undefined ? `, ${pct(w.utilization)} busy` : ""}` : "";
      const loan = w.loanedBytes ? `; ${fmtBytes(w.loanedBytes)} on loan` : "";
      return { w, project, bytes, text: `${w.name}${project ? ` (${project})` : ""}: ${w.exclusive ? "whole GPU" : fmtBytes(w.bytes)}${usage}${loan}${computeText(w)}` };
    });
    const slivers = shares.length > MAX_SHARES ? shares.filter((x) => x.bytes + (x.w.loanedBytes || 0) < SLIVER * g.memoryBytes) : [];
    const merged = slivers.length > 1 ? new Set(slivers) : new Set();
    const segs = shares.filter((x) => !merged.has(x)).flatMap(({ w, project, bytes, text }, i) => {
      const bg = color(project || w.name);
      const key = `${g.uuid}/${w.pod || w.name || i}`;
      const seg = segment(detail, text, { class: "seg share", "data-workload": w.name, "data-used": w.usedBytes ?? "",
        style: { width: `${(100 * bytes) / g.memoryBytes}%`, background: bg, color: inkOn(bg) } }, w.name, key);
      if (w.usedBytes !== undefined && w.usedBytes !== null && bytes > 0) {
        seg.append(h("i", { class: "fill", style: { width: `${Math.min(100, (100 * Math.min(w.usedBytes, bytes)) / bytes)}%` } }));
      }
      if (!w.loanedBytes) return [seg];
      /* the loan right after its share: memory it holds above its request */
      return [seg, segment(detail, `${w.name} holds ${fmtBytes(w.loanedBytes)} above its request: on loan, taken back when an owner needs it`,
        { class: "seg loan", "data-loan": w.name, "data-bytes": w.loanedBytes, style: { width: `${(100 * w.loanedBytes) / g.memoryBytes}%` } }, "loan", `${key}/loan`)];
    });
    if (merged.size) {
      const list = [...merged];
      const total = list.reduce((t, x) => t + x.bytes + (x.w.loanedBytes || 0), 0);
      segs.push(segment(detail, `${list.length} small shares, ${fmtBytes(total)} in all: ${list.map((x) => x.text).join("; ")}`,
        { class: "seg more", "data-merged": list.length, "data-bytes": total, style: { width: `${(100 * total) / g.memoryBytes}%` } }, `+${list.length} shares`, `${g.uuid}/more`));
    }
    if (g.headroomBytes) segs.push(h("div", { class: "seg headroom", title: `${fmtBytes(g.headroomBytes)} kept for the driver and CUDA contexts`,
      style: { width: `${(100 * g.headroomBytes) / g.memoryBytes}%`, marginLeft: "auto" } }));
    const usedBar = h("div", { class: "usedbar", title: known ? `${fmtBytes(g.usedBytes)} in use (NVML) of ${fmtBytes(g.memoryBytes)}` : "memory in use: no report" },
      known ? h("i", { style: { width: `${Math.min(100, (100 * g.usedBytes) / g.memoryBytes)}%` } }) : null);
    return h("div", { class: "gpu", "data-uuid": g.uuid, "data-used": known ? g.usedBytes : "" },
      h("div", { class: "name" }, h("strong", {}, `GPU ${g.index}`), ` ${g.model}`, h("br"), h("span", { class: "muted" }, fmtBytes(g.memoryBytes))),
      h("div", { class: "track" }, h("div", { class: "bar", role: "group", "aria-label": `GPU ${g.index} ${g.model}: ${shares.length} share${shares.length === 1 ? "" : "s"}` }, segs), usedBar, detail),
      h("div", { class: "num" },
        h("span", { class: "alloc" }, `${fmtBytes(held(g))} / ${fmtBytes(usable(g))} allocated`), h("br"),
        h("span", { class: "use" }, known ? `${fmtBytes(g.usedBytes)} used, ${pct(g.utilization)} busy` : "used: —"),
        g.loanedBytes ? h("span", { class: "loaned" }, h("br"), `${fmtBytes(g.loanedBytes)} on loan`) : null,
        gpuTimeLine(g)));
  }

  /* A GPU in MIG mode: its eight memory slots, each partition drawn where it sits (coloured by
     its workload's project; idle ones are kept for reuse until their room is needed). */
  function migGpu(g, projectOf) {
    const detail = h("div", { class: "segdetail muted", "aria-live": "polite" });
    const parts = [...(g.partitions || [])].sort((a, b) => a.start - b.start);
    const segs = [];
    let at = 0;
    for (const p of parts) {
      for (; at < p.start; at++) segs.push(h("div", { class: "seg free", title: `memory slot ${at}: free` }));
      const project = p.workload ? p.project || projectOf[p.workload] || "" : "";
      const who = p.workload ? `${p.workload}${project ? ` (${project})` : ""}`
        : p.managed ? "idle: kept for reuse, removed when its room is needed" : "not tessera's (an operator's partition)";
      const bg = p.workload ? color(project || p.workload) : null;
      segs.push(segment(detail, `MIG ${p.profile} on GPU ${g.index}, slot ${p.start}: ${who}${p.uuid ? ` (${p.uuid})` : ""}`,
        { class: `seg part ${p.workload ? "held" : p.managed ? "idle" : "operator"}`,
          "data-profile": p.profile, "data-start": p.start, "data-workload": p.workload || "",
          style: { width: `${(100 * (p.slots || 1)) / 8}%`, background: bg, color: bg ? inkOn(bg) : null } },
        `${p.profile}${p.workload ? ` ${p.workload}` : ""}`, `${g.uuid}/mig/${p.start}`));
      at = p.start + (p.slots || 1);
    }
    for (; at < 8; at++) segs.push(h("div", { class: "seg free", title: `memory slot ${at}: free` }));
    const busy = parts.filter((p) => p.workload).length;
    return h("div", { class: "gpu mig", "data-uuid": g.uuid },
      h("div", { class: "name" }, h("strong", {}, "MIG"), ` ${g.model}`, h("br"), h("span", { class: "muted", title: g.uuid }, `NVML GPU ${g.index}, MIG mode`)),
      h("div", { class: "track" }, h("div", { class: "bar slots", role: "group", "aria-label": `MIG GPU ${g.index} ${g.model}` }, segs), detail),
      h("div", { class: "num" }, g.partitions === null ? "partitions: NVML not open"
        : `${parts.length} partition${parts.length === 1 ? "" : "s"}, ${busy} in use`));
  }

  /* A node in one line, on its panel whether or not its rows are drawn. */
  function summary(n) {
    const gpus = n.gpus || [];
    const shares = gpus.reduce((t, g) => t + g.workloads.length, 0);
    const total = gpus.reduce((t, g) => t + usable(g), 0);
    const alloc = gpus.reduce((t, g) => t + held(g), 0);
    const known = gpus.filter((g) => g.usedBytes !== undefined);
    const mig = (n.migGpus || []).length;
    return [`${gpus.length} GPU${gpus.length === 1 ? "" : "s"}`, mig ? `${mig} in MIG mode` : null,
      `${shares} share${shares === 1 ? "" : "s"}`, `${fmtBytes(alloc)} of ${fmtBytes(total)} allocated`,
      known.length ? `${fmtBytes(known.reduce((t, g) => t + g.usedBytes, 0))} in use` : null].filter(Boolean).join(" · ");
  }
  /* What a node's rows are drawn from (the agent's report age, which changes on every poll, is
     on the header only). */
  function rowsKey(n) { return JSON.stringify([n.gpus, n.migGpus || []]); }
  /* Every name a filter can match on a node: its name, GPU models, workloads and projects. */
  function haystack(n) {
    const words = [n.name];
    for (const g of n.gpus || []) { words.push(g.model); for (const w of g.workloads) words.push(w.name, w.project || ""); }
    for (const g of n.migGpus || []) for (const p of g.partitions || []) words.push(p.profile, p.workload || "");
    return words.join(" ").toLowerCase();
  }

  pages.gpus = async function gpus() {
    const shown = new Map();  /* node name -> its panel and what it was drawn from */
    let projectOf = {};
    const list = h("div", { id: "gpu-nodes" });
    const legend = h("div", { class: "legend" });
    const count = h("span", { class: "muted", id: "gpu-count" });
    const filter = h("input", { id: "gpu-filter", type: "search", placeholder: "node, workload, project or model",
      "aria-label": "Show only the nodes matching", oninput: () => applyFilter() });
    const migNote = h("span", {});
    const intro = h("p", { class: "muted" }, "Each bar is one GPU's memory, split into the shares placed on it (coloured by project; the dark line in a share is the memory its processes use); memory a dynamic fraction holds above its request is marked as a loan. Many small shares on one GPU are drawn as one \u201c+N shares\u201d segment. Focus or point at a segment for its details. The thin bar below is the memory in use on the GPU, as the node agent reads it.", migNote);
    const simNote = h("p", { class: "badge warn", hidden: true }, "These GPUs are simulated: no NVIDIA driver here.");
    put(main, h("h1", {}, "GPUs"), simNote, intro, legend,
      h("div", { class: "row gpu-tools" }, h("label", { class: "inline" }, "Filter nodes", filter), count), list);

    /* Draws a node's rows (again), keeping keyboard focus on the segment that had it. */
    function drawRows(e) {
      const active = document.activeElement;
      const key = active && e.body.contains(active) ? active.dataset.key : null;
      e.body.replaceChildren(...e.node.gpus.map((g) => gpuRow(g, projectOf)),
        ...(e.node.migGpus || []).map((g) => migGpu(g, projectOf)));
      e.body.style.minHeight = "";
      e.drawn = e.key;
      const rows = e.body.children.length;
      if (rows && !measured) { measured = true; rowHeight = e.body.offsetHeight / rows || rowHeight; }
      if (key) {
        const again = [...e.body.querySelectorAll("[data-key]")].find((x) => x.dataset.key === key);
        if (again) again.focus({ preventScroll: true });
      }
    }
    const seen = new IntersectionObserver((entries) => {
      for (const x of entries) {
        const e = shown.get(x.target.dataset.node);
        if (!e) continue;
        e.near = x.isIntersecting;
        if (e.near && e.drawn !== e.key) drawRows(e);
      }
    }, { rootMargin: "100% 0px" });  /* one window's height ahead, either way */

    function applyFilter() {
      const q = filter.value.trim().toLowerCase();
      let visible = 0;
      for (const e of shown.values()) {
        e.panel.hidden = !!q && !e.words.includes(q);
        if (!e.panel.hidden) visible++;
      }
      count.textContent = q ? `${visible} of ${shown.size} nodes` : `${shown.size} node${shown.size === 1 ? "" : "s"}`;
    }

    const gen = routeGen;
    const draw = async () => {
      const c = await api("/api/v1/cluster");
      if (gen !== routeGen) return;  /* another page (or this one again) was opened meanwhile */
      simNote.hidden = !c.simulated;
      /* MIG partitions name their workload; the project comes with it, or from the list. */
      if (c.nodes.some((n) => (n.migGpus || []).some((g) => (g.partitions || []).some((p) => p.workload && p.project === undefined)))) {
        const names = await api("/api/v1/workloads?limit=10000&fields=name,projectName&shape=rows");
        projectOf = {};
        for (const [name, project] of names.rows) projectOf[name] = project;
      }
      /* Colours are given in the data's order, drawn or not, so they do not depend on scrolling. */
      const used = new Set();
      let anyLoan = false, anyUsed = false, anyMig = false;
      for (const n of c.nodes) {
        for (const g of n.gpus) {
          anyUsed = anyUsed || g.usedBytes !== undefined;
          for (const w of g.workloads) {
            const p = w.project || projectOf[w.name] || "";
            used.add(p); color(p || w.name);
            anyLoan = anyLoan || !!w.loanedBytes;
          }
        }
        for (const g of n.migGpus || []) {
          anyMig = true;
          for (const p of g.partitions || []) if (p.workload) { const pr = p.project || projectOf[p.workload] || ""; used.add(pr); color(pr || p.workload); }
        }
      }
      migNote.textContent = anyMig ? " A GPU in MIG mode is drawn as its eight memory slots, each partition where it sits: held by a workload, idle (kept for reuse until its room is needed) or an operator's." : "";
      put(legend, [...used].filter(Boolean).sort().map((p) => h("span", {}, h("i", { style: { background: color(p) } }), p)),
        anyUsed ? h("span", {}, h("i", { class: "key-used" }), "in use (NVML)") : null,
        anyLoan ? h("span", {}, h("i", { class: "key-loan" }), "on loan") : null,
        h("span", {}, h("i", { class: "key-headroom" }), "headroom"),
        anyMig ? h("span", {}, h("i", { class: "key-idle" }), "idle MIG partition") : null);

      const names = new Set(c.nodes.map((n) => n.name));
      for (const [name, e] of shown) if (!names.has(name)) { seen.unobserve(e.panel); e.panel.remove(); shown.delete(name); }
      let before = null;
      for (const n of c.nodes) {
        let e = shown.get(n.name);
        if (!e) {
          const head = h("div", { class: "row node-head" });
          const body = h("div", { class: "node-rows" });
          const panel = h("section", { class: "panel node", "data-node": n.name, "data-gpus": n.gpus.length + (n.migGpus || []).length, "aria-label": `node ${n.name}` }, head, body);
          e = { panel, head, body, near: false, drawn: null, headText: null };
          shown.set(n.name, e);
          seen.observe(panel);
        }
        e.node = n; e.key = rowsKey(n); e.words = haystack(n);
        const sum = summary(n);
        const headText = JSON.stringify([n.agent ? { ...n.agent, ageSeconds: null } : null, sum]);
        if (headText !== e.headText) {
          e.headText = headText;
          e.head.replaceChildren(h("h2", {}, n.name), agentNote(n), h("span", { class: "muted node-sum" }, sum));
        } else if (n.agent && n.agent.state === "ok") {  /* only the report's age moved */
          const note = e.head.querySelector(".agent");
          const text = agentNote(n).textContent;
          if (note && note.textContent !== text) note.textContent = text;
        }
        if (e.drawn === null) e.body.style.minHeight = `${Math.round(rowHeight * (n.gpus.length + (n.migGpus || []).length))}px`;
        else if (e.drawn !== e.key && e.near) drawRows(e);
        /* in the document's order (a new node goes after the one before it) */
        if ((before ? before.nextSibling : list.firstChild) !== e.panel) list.insertBefore(e.panel, before ? before.nextSibling : list.firstChild);
        before = e.panel;
      }
      if (!c.nodes.length) list.replaceChildren(h("p", { class: "muted" }, "No GPU nodes."));
      applyFilter();
      /* the panels in and near the window are drawn now, not a frame later (positions read
         first: one layout, not one per node drawn) */
      const h0 = window.innerHeight;
      const near = [...shown.values()].filter((e) => e.drawn !== e.key && !e.panel.hidden).filter((e) => {
        const r = e.panel.getBoundingClientRect();
        return r.bottom >= -h0 && r.top <= 2 * h0;
      });
      for (const e of near) { e.near = true; drawRows(e); }
    };
    await draw();
    every(5000, () => draw().catch(() => {}));
  };
})();
