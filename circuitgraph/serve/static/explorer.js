// circuitgraph explorer: plain JavaScript + SVG, no libraries, nothing fetched but this server's /api/.
// Every graph shown comes from the server (GET /api/graph/NAME?node_threshold=..&edge_threshold=..):
// the page never prunes or merges by itself; it lays out and draws what it is given.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const NODE_W = 72, NODE_H = 30, GAP = 5, COL_GAP = 10, ROW_GAP = 46, PER_LINE = 8, MARGIN_L = 44, MARGIN_T = 26,
  MARGIN_B = 10;
// a graph opens at least this large (labels of 8 px and up), scrolled to its targets; "fit" shows it whole
const OPEN_ZOOM = 0.8;

// what the page's controls are built from comes from the server's registries (GET /api/registries):
// the export kinds a pinned subgraph is saved as and the node kinds' order; none is listed here
const state = {
  graphs: [], byName: {}, name: null, view: null, selected: null, downloads: [], kindOrder: [],
  pinned: [], groups: {}, zoom: null, colors: {}, edgeColors: {}, request: 0, datasetShown: null,
  steering: [], diff: null,
};

// ------------------------------------------------------------------ small helpers
function $(id) { return document.getElementById(id); }

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// replaceChildren would write a null or undefined item as the text "null" / "undefined": skip them
function fill(node, items) {
  node.replaceChildren(...[items].flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function fmt(x, digits) {
  if (x === null || x === undefined || (typeof x === "number" && !Number.isFinite(x))) return "—";
  if (typeof x !== "number") return String(x);
  if (x !== 0 && (Math.abs(x) >= 1e5 || Math.abs(x) < 1e-3)) return x.toExponential(digits || 3);
  return x.toFixed(digits === undefined ? 4 : digits).replace(/\.?0+$/, (m) => (m.startsWith(".") ? "" : m));
}

function signed(x, digits) {
  if (typeof x !== "number" || !Number.isFinite(x)) return el("span", {}, "—");
  return el("span", { class: x < 0 ? "neg" : "pos" }, (x >= 0 ? "+" : "") + fmt(x, digits));
}

function showToken(t) { return t === null || t === undefined ? "" : JSON.stringify(t); }

function setStatus(text, error) {
  const s = $("status");
  s.textContent = text;
  s.className = "status" + (error ? " error" : "");
}

async function api(path) {
  const response = await fetch(path);
  const body = await response.json();
  if (!response.ok) {  // the error carries the answer (e.g. the thresholds a refused view was asked at)
    const error = new Error(body.error || response.statusText);
    error.body = body;
    throw error;
  }
  return body;
}

function nameUrl(endpoint, name, params) {
  const query = new URLSearchParams(params || {}).toString();
  return `/api/${endpoint}/${encodeURIComponent(name)}` + (query ? "?" + query : "");
}

function thresholds() {  // the view's settings: thresholds and the node budget (top_k_nodes)
  return { node_threshold: $("node-threshold").value, edge_threshold: $("edge-threshold").value,
           top_k_nodes: budgetText() };
}

function budgetText() {  // the budget slider's value; at its right end, every node ("all")
  const s = $("node-budget");
  return Number(s.value) >= Number(s.max) ? "all" : s.value;
}

// the sliders and their read-outs show the thresholds a view was asked at ("—" when unknown: a graph
// that could not be read); the read-out is the exact value, the slider its nearest step
function showThresholds(nodeThreshold, edgeThreshold) {
  for (const [id, v] of [["node-threshold", nodeThreshold], ["edge-threshold", edgeThreshold]]) {
    const known = typeof v === "number" && Number.isFinite(v);
    if (known) $(id).value = v;
    const exact = known ? String(Number(v.toFixed(4))) : "—";
    $(id + "-value").textContent = !known ? exact : exact.includes(".") && exact.split(".")[1].length >= 2 ? exact : v.toFixed(2);
    $(id).dataset.requested = known ? String(v) : "";
  }
}

// a view that could not be loaded: nothing of the previous graph stays on the page, and the status says why
function clearView(message) {
  state.view = null;
  state.selected = null;
  const root = $("graph");
  root.replaceChildren();
  root.removeAttribute("viewBox");
  root.setAttribute("width", 0);
  root.setAttribute("height", 0);
  delete root.dataset.nodeThreshold;
  delete root.dataset.edgeThreshold;
  root.dataset.drawnNodes = "0";
  $("prompt").replaceChildren();
  $("search-results").replaceChildren();
  const panel = $("details");
  panel.dataset.node = "";
  panel.dataset.state = "error";
  fill(panel, [el("h3", {}, "nothing shown"), el("p", { class: "neg", id: "load-error" }, message)]);
  setStatus(message, true);
}

function nodeText(n) {
  if (n.supernode) return n.supernode;
  if (n.kind === "embedding") return showToken(n.token);
  if (n.kind === "logit") return "logit " + showToken(n.token);
  return n.caption.replace(/ @\d+$/, "");
}

function nodeTitle(n) {
  const parts = [n.id];
  if (n.token !== null && n.token !== undefined) parts.push("token " + showToken(n.token));
  if (n.label) parts.push(n.label);
  parts.push("activation " + fmt(n.activation));
  if (n.influence !== null && n.influence !== undefined) parts.push("influence " + fmt(n.influence));
  return parts.join("\n");
}

// ------------------------------------------------------------------ graphs and views
// the "save pinned" links, one per export kind the explorer offers, and the node kinds' order
async function loadRegistries() {
  const registries = await api("/api/registries");
  state.downloads = registries.downloads;
  state.kindOrder = registries.node_kinds;
  // one link per kind, a space between two (where the line may break)
  $("save-links").replaceChildren(...registries.downloads.flatMap((d, i) => [i ? " " : "", el("a", { id: "save-" + d.format,
    class: "disabled", download: true, "data-format": d.format, title: `save the pinned nodes as ${d.label} (*${d.suffix})` },
    d.label)]).filter((c) => c !== ""));
}

async function start() {
  try {
    await loadRegistries();
    const listing = await api("/api/graphs");
    state.graphs = listing.graphs;
    state.colors = listing.kind_colors;
    state.edgeColors = listing.edge_colors;
    const select = $("graph-select");
    for (const g of listing.graphs) {
      state.byName[g.name] = g;
      select.append(el("option", { value: g.name }, g.kind === "aggregate" ? `${g.name} (aggregate)` : g.name));
    }
    if (listing.features.length) await loadFeatures();
    if (!listing.graphs.length) {
      setStatus(listing.features.length ? "no graphs; features: " + listing.features.join(", ") : "nothing to show");
      document.body.dataset.state = "ready";
      return;
    }
    const hash = new URLSearchParams(location.hash.slice(1));
    const wanted = hash.get("graph");
    const first = listing.graphs.find((g) => g.kind !== "prompt") || listing.graphs[0];
    await selectGraph(wanted && state.byName[wanted] ? wanted : first.name);
    const other = hash.get("diff");  // #graph=A&diff=B[&match=M]: open the comparison too
    if (other && state.byName[other]) {
      $("diff-b").value = other;
      if (hash.get("match")) $("diff-match").value = hash.get("match");
      await showDiff();
    }
  } catch (err) {
    setStatus(err.message, true);
    document.body.dataset.state = "error";
  }
}

async function selectGraph(name) {
  state.name = name;
  state.pinned = [];
  state.groups = {};
  state.selected = null;
  state.zoom = null;
  state.diff = null;
  $("graph-select").value = name;
  $("proposals").replaceChildren();
  $("details").replaceChildren(el("p", { class: "muted" }, "Click a node to see its inputs, outputs and dashboard."));
  history.replaceState(null, "", "#graph=" + encodeURIComponent(name));
  await loadView(true);
  renderPinned();
  await showDataset();
  await showQK();
  await showSteering();
  fillDiffChoices();
}

async function loadView(useDefaults) {
  const ticket = ++state.request;
  document.body.dataset.state = "loading";
  setStatus("pruning…");
  const params = useDefaults ? {} : thresholds();
  if (Object.keys(state.groups).length) params.supernodes = JSON.stringify(state.groups);
  try {
    const view = await api(nameUrl("graph", state.name, params));
    if (ticket !== state.request) return;  // a newer request is on its way
    state.view = view;
    showThresholds(view.node_threshold, view.edge_threshold);  // what this view was pruned at
    // the node budget: a large graph opens at its most influential nodes; the right end is "all"
    $("node-budget").max = Math.max(1, view.n_rankable_nodes);
    $("node-budget").value = view.top_k_nodes === null ? view.n_rankable_nodes : view.top_k_nodes;
    $("node-budget-value").textContent = budgetText();
    renderPrompt(view);
    render();
    fillSearchFilters();
    runSearch();
    renderPinned();
    showCounts();
    document.body.dataset.state = "ready";
  } catch (err) {
    if (ticket !== state.request) return;
    const asked = err.body || {};
    if (useDefaults || "node_threshold" in asked) {  // the thresholds asked for, as far as they are known
      showThresholds(asked.node_threshold, asked.edge_threshold);
    }
    clearView(`${state.name}: ${err.message}`);
    document.body.dataset.state = "error";
  }
}

// what render() draws: every node of the view but the remainders when they are hidden, and the
// edges between drawn nodes
function drawnParts(view) {
  const showRem = $("show-remainders").checked;
  const nodes = view.nodes.filter((n) => showRem || n.kind !== "remainder");
  const shown = new Set(nodes.map((n) => n.id));
  const edges = view.edges.filter((e) => shown.has(e.source) && shown.has(e.target));
  return { nodes, edges };
}

function showCounts() {
  const view = state.view;
  if (!view) return;
  const drawn = drawnParts(view);
  const hidden = view.nodes.length - drawn.nodes.length;
  $("node-threshold").disabled = $("edge-threshold").disabled = $("node-budget").disabled = !view.prunable;
  const budget = view.prunable && view.top_k_nodes !== null && view.top_k_nodes < view.n_rankable_nodes ?
    `; at most ${view.top_k_nodes} nodes by influence (max nodes)` : "";
  const share = view.influence_share !== null && view.influence_share !== undefined ?
    `, ${Math.round(100 * view.influence_share)}% of the influence` : "";
  setStatus(`${drawn.nodes.length} of ${view.n_nodes_before} nodes${share}, ${drawn.edges.length} of ${view.n_edges_before} edges` +
    budget + (hidden ? ` (${hidden} remainder nodes hidden)` : "") + (view.prunable ? "" : "; no targets: shown unpruned"));
}

function renderPrompt(view) {
  const parts = [];
  const entry = state.byName[view.name];
  if (entry && entry.file) {
    parts.push(el("a", { href: "/files/" + entry.file.split("/").map(encodeURIComponent).join("/"), download: true,
      title: "the graph file as served" }, "file"), " · ");
  }
  if (view.model) parts.push(el("span", { class: "tag" }, view.model + " · "));
  if (view.prompt) parts.push(el("span", {}, JSON.stringify(view.prompt)));
  for (const [k, v] of Object.entries(view.scores || {})) parts.push(el("span", { class: "tag" }, ` · ${k} ${fmt(v, 3)}`));
  $("prompt").replaceChildren(...parts);
}

// ------------------------------------------------------------------ layout and drawing
function rankKey(n) {
  const attention = n.kind === "attention_head" || (n.kind === "bias" && n.index === 0);
  return [n.layer, attention ? 0 : 1];
}

function layout(nodes) {
  // rows: one per (layer, attention side), bottom to top; columns: one per position, left to right;
  // a cell of more than PER_LINE nodes wraps onto further lines
  const rows = [...new Set(nodes.map((n) => rankKey(n).join(":")))]
    .map((k) => k.split(":").map(Number)).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  const rowIndex = new Map(rows.map((r, i) => [r.join(":"), i]));
  const cells = new Map();
  for (const n of nodes) {
    const key = rowIndex.get(rankKey(n).join(":")) + "|" + n.position;
    if (!cells.has(key)) cells.set(key, []);
    cells.get(key).push(n);
  }
  const positions = [...new Set(nodes.map((n) => n.position))].sort((a, b) => a - b);
  const width = new Map(positions.map((p) => [p, 1]));
  const lines = rows.map(() => 1);
  for (const [key, members] of cells) {
    const [r, p] = key.split("|").map(Number);
    width.set(p, Math.max(width.get(p), Math.min(members.length, PER_LINE)));
    lines[r] = Math.max(lines[r], Math.ceil(members.length / PER_LINE));
  }
  const colX = new Map();
  let x = MARGIN_L;
  for (const p of positions) {
    colX.set(p, x);
    x += width.get(p) * (NODE_W + GAP) + COL_GAP;
  }
  const rowTop = new Array(rows.length);
  let y = MARGIN_T;
  for (let r = rows.length - 1; r >= 0; r--) {
    rowTop[r] = y;
    y += lines[r] * (NODE_H + GAP) + ROW_GAP;
  }
  const place = new Map();
  for (const [key, members] of cells) {
    const [r, p] = key.split("|").map(Number);
    members.sort((a, b) => state.kindOrder.indexOf(a.kind) - state.kindOrder.indexOf(b.kind) || a.index - b.index);
    members.forEach((n, i) => {
      const line = Math.floor(i / PER_LINE), inLine = Math.min(PER_LINE, members.length - line * PER_LINE);
      const free = (width.get(p) - inLine) * (NODE_W + GAP) / 2;
      place.set(n.id, { x: colX.get(p) + free + (i % PER_LINE) * (NODE_W + GAP), y: rowTop[r] + line * (NODE_H + GAP) });
    });
  }
  return { place, rows, positions, colX, rowTop, lines, totalW: x, totalH: y - ROW_GAP + MARGIN_B };
}

function render() {
  const view = state.view;
  if (!view) return;  // nothing loaded (a failed load): nothing to draw
  const { nodes, edges } = drawnParts(view);
  const lay = layout(nodes);
  const root = $("graph");
  root.replaceChildren();
  root.setAttribute("viewBox", `0 0 ${lay.totalW} ${lay.totalH}`);
  let opening = false;
  if (state.zoom === null || state.zoom === "fit") {  // fit the canvas, within reason
    const canvas = $("canvas");
    const fit = Math.max(0.3, Math.min(1.3, (canvas.clientWidth - 8) / lay.totalW, (canvas.clientHeight - 8) / lay.totalH));
    opening = state.zoom === null;
    state.zoom = opening ? Math.max(OPEN_ZOOM, fit) : fit;
  }
  root.setAttribute("width", Math.round(lay.totalW * state.zoom));
  root.setAttribute("height", Math.round(lay.totalH * state.zoom));
  root.dataset.nodeThreshold = view.node_threshold;
  root.dataset.edgeThreshold = view.edge_threshold;

  // axes: a label per row (layer) at the left, the prompt's tokens over the columns
  const tokens = view.prompt_tokens || [];
  const outputLayers = new Set(nodes.filter((n) => n.kind === "logit" || n.kind === "target").map((n) => n.layer));
  lay.rows.forEach(([layer, sub], i) => {
    const y = lay.rowTop[i] + lay.lines[i] * (NODE_H + GAP) / 2 + 2;
    const name = layer < 0 ? "Emb" : outputLayers.has(layer) && sub === 1 ? "Out" : `L${layer}` + (sub === 0 ? " attn" : "");
    const t = svg("text", { x: 6, y, class: "axis" });
    t.textContent = name;
    root.append(t);
  });
  for (const p of lay.positions) {
    const t = svg("text", { x: lay.colX.get(p) + 2, y: 16, class: "axis" });
    t.textContent = `${p}` + (tokens[p] !== undefined ? " " + showToken(tokens[p]) : "");
    root.append(t);
  }

  const maxAbs = Math.max(1e-30, ...edges.map((e) => Math.abs(e.weight)));
  const edgeLayer = svg("g", { class: "edges" });
  for (const e of edges) {
    const s = lay.place.get(e.source), t = lay.place.get(e.target);
    const x1 = s.x + NODE_W / 2, y1 = s.y, x2 = t.x + NODE_W / 2, y2 = t.y + NODE_H;
    const my = (y1 + y2) / 2;
    const path = svg("path", {
      d: `M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}`, class: "edge",
      stroke: e.weight < 0 ? state.edgeColors.negative : state.edgeColors.positive,
      "stroke-width": (0.4 + 4.6 * Math.abs(e.weight) / maxAbs).toFixed(2),
      "data-source": e.source, "data-target": e.target,
    });
    const title = svg("title");
    title.textContent = `${e.source} → ${e.target}: ${e.weight}`;
    path.append(title);
    edgeLayer.append(path);
  }
  // linearised query / key edges into heads (graph.head_inputs): dashed, on the same width scale
  for (const e of (view.linearised_edges || []).filter((e) => shown.has(e.source) && shown.has(e.target))) {
    const s = lay.place.get(e.source), t = lay.place.get(e.target);
    const x1 = s.x + NODE_W / 2, y1 = s.y, x2 = t.x + NODE_W / 2 + (e.kind === "query" ? -8 : 8), y2 = t.y + NODE_H;
    const my = (y1 + y2) / 2;
    const path = svg("path", {
      d: `M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}`, class: "edge linearised " + e.kind,
      stroke: e.weight < 0 ? state.edgeColors.negative : state.edgeColors.positive,
      "stroke-width": Math.min(5, 0.4 + 4.6 * Math.abs(e.weight) / maxAbs).toFixed(2),
      "stroke-dasharray": e.kind === "query" ? "5 3" : "2 2",
      "data-source": e.source, "data-target": e.target, "data-kind": e.kind,
    });
    const title = svg("title");
    title.textContent = `${e.source} → ${e.target} (${e.kind}, linearised): ${e.weight}`;
    path.append(title);
    edgeLayer.append(path);
  }
  root.append(edgeLayer);

  const nodeLayer = svg("g", { class: "nodes" });
  for (const n of nodes) {
    const p = lay.place.get(n.id);
    const classes = ["node", n.kind];
    if (n.is_target) classes.push("target");
    if (n.supernode) classes.push("supernode");
    if (state.pinned.includes(n.id)) classes.push("pinned");
    if (state.selected === n.id) classes.push("selected");
    const g = svg("g", { class: classes.join(" "), "data-id": n.id, transform: `translate(${p.x},${p.y})` });
    g.append(svg("rect", { width: NODE_W, height: NODE_H, rx: 5, fill: state.colors[n.kind] || "#fff" }));
    const main = svg("text", { x: NODE_W / 2, y: 12, "text-anchor": "middle" });
    main.textContent = truncate(nodeText(n), 13);
    const sub = svg("text", { x: NODE_W / 2, y: 24, "text-anchor": "middle", class: "sub" });
    const token = n.kind === "embedding" || n.kind === "logit";
    sub.textContent = truncate(n.supernode ? `${n.members.length} nodes` : (!token && n.label) ||
      (n.kind === "feature" || n.kind === "neuron" ? "a=" + fmt(n.activation, 2) : `@${n.position}`), 16);
    const title = svg("title");
    title.textContent = nodeTitle(n);
    g.append(main, sub, title);
    g.addEventListener("click", () => selectNode(n.id));
    nodeLayer.append(g);
  }
  root.append(nodeLayer);
  root.dataset.drawnNodes = String(nodes.length);
  root.dataset.zoom = state.zoom.toFixed(3);
  if (opening) {  // a graph larger than the canvas at a legible size: show its targets first
    const targets = nodes.filter((n) => n.is_target).map((n) => lay.place.get(n.id));
    if (targets.length) {
      const canvas = $("canvas");
      const x = targets.reduce((a, p) => a + p.x + NODE_W / 2, 0) / targets.length;
      canvas.scrollLeft = Math.max(0, x * state.zoom - canvas.clientWidth / 2);
      canvas.scrollTop = 0;
    }
  }
  highlight();
  highlightDiff();
}

function truncate(text, limit) { return text.length <= limit ? text : text.slice(0, limit - 1) + "…"; }

function highlight() {
  const root = $("graph");
  root.classList.toggle("focus", state.selected !== null);
  for (const path of root.querySelectorAll(".edge")) {
    path.classList.toggle("hot", path.dataset.source === state.selected || path.dataset.target === state.selected);
  }
  for (const g of root.querySelectorAll(".node")) {
    g.classList.toggle("selected", g.dataset.id === state.selected);
    g.classList.toggle("pinned", state.pinned.includes(g.dataset.id));
  }
}

// ------------------------------------------------------------------ one node
async function selectNode(id) {
  state.selected = id;
  highlight();
  const panel = $("details");
  panel.dataset.node = id;
  panel.dataset.state = "loading";
  try {
    const query = new URLSearchParams(thresholds()).toString();
    const node = await api(`/api/node/${encodeURIComponent(state.name)}/${id}?${query}`);
    if (state.selected !== id) return;
    fill(panel, nodePanel(node));
    panel.dataset.state = "ready";
  } catch (err) {
    panel.replaceChildren(el("p", { class: "neg" }, err.message));
    panel.dataset.state = "error";
  }
}

function factsTable(rows) {
  return el("table", {}, rows.filter(([, v]) => v !== undefined).map(([k, v]) =>
    el("tr", {}, el("th", {}, k), el("td", { class: typeof v === "number" ? "num" : "" }, v instanceof Node ? v : fmt(v)))));
}

function edgeTable(title, edges, total) {
  if (!edges.length) return [el("h4", {}, title + ": none")];
  const rows = edges.map((e) => el("tr", { class: "item" },
    el("td", {}, el("a", { href: "#", onclick: (ev) => { ev.preventDefault(); selectNode(e.id); } },
      e.kind === "embedding" || e.kind === "logit" ? `${e.caption} ${showToken(e.token)}` : e.caption)),
    el("td", { class: "label" }, e.label || ""), el("td", { class: "num" }, signed(e.weight))));
  return [el("h4", {}, `${title} (${edges.length} of ${total}, strongest first)`), el("table", {}, rows)];
}

function nodePanel(n) {
  const pinned = state.pinned.includes(n.id);
  const out = [
    el("h3", {}, n.supernode ? `supernode ${n.supernode}` : n.caption,
       n.token !== null ? " " + showToken(n.token) : ""),
    n.label ? el("div", { class: "label" }, n.label) : null,
    el("div", { class: "tag" }, n.id),
    el("button", { id: "pin-button", onclick: () => togglePin(n.id) }, pinned ? "unpin" : "pin"),
    factsTable([["kind", n.kind], ["layer", n.layer], ["position", n.position], ["index", n.index],
                ["activation", n.activation], ["pre-activation", n.pre_activation ?? undefined],
                ["constant", n.constant ?? undefined], ["influence", n.influence ?? undefined],
                ["sum of inputs", n.n_inputs ? n.sum_inputs : undefined]]),
  ];
  if (n.members) out.push(el("div", { class: "tag" }, "members: " + n.members.join(", ")));
  if (n.dashboard) out.push(...dashboardPanel(n.dashboard));
  for (const head of n.qk || []) out.push(...qkPanel(head, n.qk_names || {}));
  const valueTitle = (n.linearised_inputs || []).length ? "inputs (value path, exact)" : "inputs";
  out.push(...edgeTable(valueTitle, n.inputs, n.n_inputs));
  for (const lin of n.linearised_inputs || []) {  // graph.head_inputs: query / key edges, first order
    out.push(factsTable([[`${lin.kind} inputs: sum + constant`, lin.sum_inputs + (lin.constant ?? 0)],
                         [`${lin.kind}: Σ dT/da · a`, lin.total ?? undefined]]));
    out.push(...edgeTable(`${lin.kind} inputs (linearised)`, lin.inputs, lin.n_inputs));
  }
  out.push(...edgeTable("outputs", n.outputs, n.n_outputs));
  return out;
}

function tokenChips(list) {
  return el("div", { class: "chips" }, (list || []).map((t) => {
    const text = typeof t === "object" && t !== null ? (t.token ?? t.token_str ?? t.token_id) : t;
    const value = typeof t === "object" && t !== null ? t.value : null;
    return el("span", { title: value !== null && value !== undefined ? String(value) : "" },
      showToken(text) + (typeof value === "number" ? " " + fmt(value, 2) : ""));
  }));
}

const UNIT_WORDS = { features: "feature", neurons: "neuron", heads: "head" };

function dashboardPanel(d) {
  const unit = UNIT_WORDS[d.units] || "feature";
  const out = [el("h4", {}, `dashboard: ${unit} ${d.index} of layer ${d.layer}`, d.source ? el("span", { class: "muted" }, ` (${d.source})`) : null)];
  if (d.label) out.push(el("div", { class: "label" }, d.label));
  if (d.metrics) {  // an attention head: one section per ranking of its (query, key) pairs
    for (const sec of d.metrics) {
      out.push(el("h4", { class: "metric" }, `ranked by ${sec.metric}`));
      out.push(...dashboardSection(sec, `top (query → key) pairs by ${sec.metric}`));
    }
    return out;
  }
  out.push(...dashboardSection(d, "top examples"));
  return out;
}

// text with the query/activating token in «» and a head's key in ⟦⟧, both drawn as <mark>
function markedText(text) {
  const out = [];
  const re = /(«⟦|⟦|«)([\s\S]*?)(⟧»|⟧|»)/g;
  let at = 0, m;
  while ((m = re.exec(text)) !== null) {
    out.push(text.slice(at, m.index));
    const cls = m[1] === "«" ? "query" : m[1] === "⟦" ? "key" : "query key";
    out.push(el("mark", { class: cls, title: cls === "query" ? "query / activating token" : cls === "key" ?
      "key token" : "query and key" }, m[2]));
    at = m.index + m[0].length;
  }
  out.push(text.slice(at));
  return out;
}

function dashboardSection(d, title) {
  const out = [];
  const s = d.stats || {};
  const seen = s.n_pairs !== undefined ? "pairs" : "tokens";
  out.push(factsTable([["density", s.density], [`active / ${seen}`, s.n_active !== undefined ?
    `${s.n_active} / ${s.n_tokens ?? s.n_pairs ?? "?"}` : undefined], ["max", s.max_activation],
    ["mean active", s.mean_active_activation]]));
  const q = Object.entries(d.quantiles || {});
  if (q.length) out.push(el("div", { class: "tag" }, "quantiles: " + q.map(([k, v]) => `${k} ${fmt(v, 3)}`).join(", ")));
  const names = { top_output_tokens: "promotes", bottom_output_tokens: "suppresses", top_input_tokens: "read from tokens",
                  top_gate_tokens: "gate read from tokens" };
  for (const [key, list] of Object.entries(d.tokens || {})) {
    out.push(el("h4", {}, names[key] || key), tokenChips(list));
  }
  out.push(el("h4", {}, `${title} (${d.examples.length} of ${d.n_examples})`));
  const box = el("div", { class: "examples" });
  for (const ex of d.examples) {
    const pair = ex.key_position !== undefined && ex.key_position !== null;
    const where = ex.row_id !== undefined ? ` row ${ex.row_id}@${ex.position}` + (pair ? `→${ex.key_position}` : "") : "";
    const extra = pair ? ` (A ${fmt(ex.attention, 3)}` + (ex.score !== null && ex.score !== undefined ?
      `, score ${fmt(ex.score, 3)}` : "") + (ex.norm !== null && ex.norm !== undefined ? `, norm ${fmt(ex.norm, 3)}` : "") + ")" : "";
    const act = el("span", { class: "act" }, `#${ex.rank ?? "?"} ${pair ? "" : "a="}${fmt(ex.activation, 3)}${where}${extra}`);
    if (pair) {
      const far = ex.key_text && !(ex.text || "").includes("⟦");
      box.append(el("div", { class: "example" }, act, ...markedText(ex.text || ""),
        far ? el("span", { class: "muted" }, " … key: ") : "", ...(far ? markedText(ex.key_text) : [])));
      continue;
    }
    const m = ex.marked;
    box.append(m ? el("div", { class: "example" }, act, m.before, el("mark", {}, m.token), m.after)
                 : el("div", { class: "example" }, act, ex.text ?? (ex.tokens || []).join(" ")));
  }
  out.push(box);
  return out;
}

function qkPanel(h, names) {
  const out = [el("h4", {}, `QK L${h.layer}H${h.head}: query ${h.query_position} → key ${h.key_position}`),
               el("div", { class: "tag" }, `score ${fmt(h.score)}, p=${fmt(h.probability, 3)}; pairs + constants ` +
                 fmt(h.pairs_sum_plus_constant))];
  const link = (id) => el("a", { href: "#", title: id, onclick: (ev) => { ev.preventDefault(); selectNode(id); } },
    (names && names[id]) || id);
  out.push(el("table", {}, el("tr", {}, el("th", {}, "query node"), el("th", {}, "key node"), el("th", {}, "value")),
    (h.pairs || []).map((p) => el("tr", {}, el("td", {}, link(p.query_node)), el("td", {}, link(p.key_node)),
      el("td", { class: "num" }, signed(p.value))))));
  for (const [title, list] of [["query marginals", h.query_marginals], ["key marginals", h.key_marginals]]) {
    out.push(el("table", {}, el("tr", {}, el("th", {}, title), el("th", {}, "")), (list || []).map((m) =>
      el("tr", {}, el("td", {}, link(m.node)), el("td", { class: "num" }, signed(m.value))))));
  }
  return out;
}

// ------------------------------------------------------------------ search
function fillSearchFilters() {
  const kinds = [...new Set(state.view.nodes.map((n) => n.kind))].sort();
  const layers = [...new Set(state.view.nodes.map((n) => n.layer))].sort((a, b) => a - b);
  for (const [id, values] of [["search-kind", kinds], ["search-layer", layers]]) {
    const select = $(id), keep = select.value;
    select.replaceChildren(select.options[0], ...values.map((v) => el("option", { value: v }, v)));
    select.value = values.map(String).includes(keep) ? keep : "";
  }
}

function runSearch() {
  if (!state.view) return;
  const q = $("search").value.trim().toLowerCase();
  const kind = $("search-kind").value, layer = $("search-layer").value;
  const active = q || kind || layer;
  const hits = !active ? [] : state.view.nodes.filter((n) =>
    (!kind || n.kind === kind) && (!layer || String(n.layer) === layer) &&
    (!q || [n.id, n.caption, n.label, n.token, n.supernode].some((t) => t && String(t).toLowerCase().includes(q))));
  const ids = new Set(hits.map((n) => n.id));
  for (const g of $("graph").querySelectorAll(".node")) g.classList.toggle("match", ids.has(g.dataset.id));
  $("search-results").replaceChildren(...hits.slice(0, 60).map((n) => el("div", { class: "item", "data-id": n.id,
    onclick: () => selectNode(n.id) }, el("span", { class: "swatch", style: `background:${state.colors[n.kind]}` }),
    el("span", { class: "grow" }, nodeText(n) + (n.label ? " — " + n.label : "")), el("span", { class: "tag" }, `@${n.position}`))),
    active ? el("div", { class: "tag" }, `${hits.length} match${hits.length === 1 ? "" : "es"}`) : "");
}

// ------------------------------------------------------------------ pins, groups, saving
function viewIds() {
  const ids = new Set();
  for (const n of state.view ? state.view.nodes : []) { ids.add(n.id); for (const m of n.members || []) ids.add(m); }
  return ids;
}

function togglePin(id) {
  const i = state.pinned.indexOf(id);
  if (i >= 0) state.pinned.splice(i, 1); else state.pinned.push(id);
  const button = $("pin-button");
  if (button && $("details").dataset.node === id) button.textContent = i >= 0 ? "pin" : "unpin";
  renderPinned();
  highlight();
}

function renderPinned() {
  const inView = viewIds();
  $("pinned-count").textContent = String(state.pinned.length);
  $("pinned").replaceChildren(...state.pinned.map((id) => el("div", { class: "item", "data-id": id },
    el("span", { class: "grow", onclick: () => selectNode(id) }, id + (inView.has(id) ? "" : " (not in view)")),
    el("button", { onclick: () => togglePin(id) }, "×"))));
  $("groups").replaceChildren(...Object.entries(state.groups).map(([name, members]) => el("div", { class: "item" },
    el("span", { class: "grow" }, `▣ ${name} (${members.length})`),
    el("button", { onclick: () => { delete state.groups[name]; loadView(false); } }, "ungroup"))));
  const saved = state.pinned.filter((id) => inView.has(id));
  const groups = {};
  for (const [name, members] of Object.entries(state.groups)) {
    const kept = members.filter((m) => saved.includes(m));
    if (kept.length) groups[name] = kept;
  }
  for (const download of state.downloads) {
    const link = $("save-" + download.format);
    if (!saved.length || !state.name) { link.removeAttribute("href"); link.className = "disabled"; continue; }
    const params = { format: download.format, nodes: saved.join(","), ...thresholds() };
    if (Object.keys(groups).length) params.supernodes = JSON.stringify(groups);
    link.href = nameUrl("export", state.name, params);
    link.className = "";
  }
}

function groupPinned() {
  const name = $("group-name").value.trim() || `group ${Object.keys(state.groups).length + 1}`;
  const grouped = new Set(Object.values(state.groups).flat());
  const inView = viewIds();
  const members = state.pinned.filter((id) => !grouped.has(id) && inView.has(id));
  if (members.length < 2) { setStatus("pin two or more ungrouped nodes to group them", true); return; }
  state.groups[name] = members;
  $("group-name").value = "";
  loadView(false);
}

async function propose() {
  try {
    const answer = await api(nameUrl("supernodes", state.name, thresholds()));
    const entries = Object.entries(answer.proposals);
    $("proposals").replaceChildren(...(entries.length ? entries.map(([name, members]) => el("div", { class: "item" },
      el("span", { class: "grow", title: members.join("\n") }, `${name}: ${members.length} nodes`),
      el("button", { onclick: () => {
        for (const m of members) if (!state.pinned.includes(m)) state.pinned.push(m);
        state.groups[name] = members;
        loadView(false);
      } }, "apply"))) : [el("div", { class: "tag" }, "no proposals at these thresholds")]));
  } catch (err) { setStatus(err.message, true); }
}

// ------------------------------------------------------------------ QK and datasets
async function showQK() {
  const section = $("qk-section");
  section.hidden = !(state.view && state.view.has_qk);
  if (section.hidden) return;
  const answer = await api(nameUrl("qk", state.name));
  $("qk-list").replaceChildren(...answer.heads.map((h) => el("div", { class: "item", onclick: () => {
    fill($("details"), qkPanel(h, answer.names));
    $("details").dataset.node = "";
  } }, el("span", { class: "grow" }, `L${h.layer}H${h.head} ${h.query_position}→${h.key_position}`),
    el("span", { class: "tag" }, `score ${fmt(h.score, 3)} p=${fmt(h.probability, 2)}`))));
}

async function showDataset() {
  const g = state.byName[state.name];
  const section = $("dataset-section");
  section.hidden = !g || !g.dataset;
  if (section.hidden) return;
  const ds = await api(nameUrl("dataset", g.dataset));
  $("dataset-name").textContent = `${ds.name}: ${ds.n_ok} of ${ds.n_prompts} ok`;
  $("dataset-scores").replaceChildren(el("table", {}, el("tr", {}, el("th", {}, "score"), el("th", {}, "mean"),
    el("th", {}, "median")), Object.entries(ds.scores).map(([k, v]) =>
    el("tr", { title: `min ${fmt(v.min, 4)}, max ${fmt(v.max, 4)}` }, el("td", {}, k.replace("_score", "")),
      el("td", { class: "num" }, fmt(v.mean, 3)), el("td", { class: "num" }, fmt(v.median, 3))))));
  const rows = [el("div", { class: "item", onclick: () => selectGraph(ds.aggregate) },
    el("span", { class: "grow" }, "▦ aggregate"), el("span", { class: "tag" }, `${ds.n_aggregated} prompts`))];
  for (const r of ds.rows) {
    rows.push(el("div", { class: "item" + (r.graph === state.name ? " current" : ""), "data-row": r.id,
      onclick: () => r.graph && selectGraph(r.graph) },
      el("span", { class: "grow" }, `${r.row}. ${r.id}` + (r.status !== "ok" ? ` (${r.status})` : "")),
      el("span", { class: "tag", title: "replacement / completeness score" },
        r.replacement_score !== undefined ? `${fmt(r.replacement_score, 3)} / ${fmt(r.completeness_score, 3)}` : "")));
  }
  $("dataset-rows").replaceChildren(...rows);
}

// ------------------------------------------------------------------ steering results (the spec's steer: items)
async function showSteering() {
  const section = $("steering-section");
  state.steering = [];
  section.hidden = !(state.view && state.view.n_steering);
  if (section.hidden) return;
  const name = state.name;
  const answer = await api(nameUrl("steering", name));
  if (state.name !== name) return;
  state.steering = answer.steering;
  $("steering-count").textContent = String(answer.steering.length);
  $("steering-list").replaceChildren(...answer.steering.map((item, i) => el("div", { class: "item steer-item", "data-steer": i,
    onclick: () => showSteerItem(i) }, el("span", { class: "grow" }, steerName(item, i)),
    el("span", { class: "tag" + (item.status === "ok" ? "" : " neg") }, item.status === "ok" ?
      steerSummary(item.result) : item.status))));
}

function steerName(item, i) { return (item.params && item.params.name) || (item.result && item.result.name) || `steer[${i}]`; }

function steerSummary(r) {
  return r && r.intervened ? `${JSON.stringify(r.baseline.text)} → ${JSON.stringify(r.intervened.text)}` : "";
}

function showSteerItem(i) {
  const panel = $("details");
  panel.dataset.node = `steer ${i}`;
  fill(panel, steerPanel(state.steering[i], i));
  panel.dataset.state = "ready";
}

function steerPanel(item, i) {
  const out = [el("h3", {}, `steer[${i}] ${steerName(item, i)}`),
               el("div", { class: "tag" + (item.status === "ok" ? "" : " neg") }, `status: ${item.status}`)];
  if (item.error) out.push(el("p", { class: "neg steer-error" }, item.error));
  if (item.refers_to) out.push(el("div", { class: "tag" }, item.refers_to));
  const r = item.result;
  if (!r) return out;
  out.push(el("h4", {}, "interventions (as resolved)"), el("table", {},
    el("tr", {}, el("th", {}, "node / site"), el("th", {}, "mode"), el("th", {}, "value"), el("th", {}, "positions")),
    (r.interventions || []).map((iv) => el("tr", {},
      el("td", { title: iv.site || "" }, iv.node || `${iv.site || ""} L${iv.layer ?? "?"}` + (iv.index !== undefined ? ` #${iv.index}` : "")),
      el("td", {}, iv.mode || ""), el("td", { class: "num" }, iv.value !== undefined ? fmt(iv.value) : ""),
      el("td", {}, Array.isArray(iv.positions) ? iv.positions.join(", ") : String(iv.positions ?? ""))))));
  const runs = [["baseline", r.baseline], ["intervened", r.intervened]];
  out.push(el("h4", {}, "generated text"), el("table", {}, runs.map(([k, g]) => el("tr", {}, el("th", {}, k),
    el("td", {}, el("span", { class: `steer-text steer-${k}` }, g ? g.text : ""),
      el("div", { class: "tag" }, "tokens " + (g ? (g.tokens || []).join(", ") : "")))))));
  if (r.metric) {
    const m = r.metric;
    out.push(el("h4", {}, "metric" + (m.name ? ": " + m.name : "")), factsTable([["baseline", m.baseline],
      ["intervened", m.intervened], ["actual change", m.actual], ["predicted (direct)", m.predicted_direct],
      ["predicted (total)", m.predicted_total]].map(([k, v]) => [k, v === null ? undefined : v])));
  }
  for (const [k, g] of runs) {
    if (!g || !g.steps) continue;
    out.push(el("h4", {}, `${k}: top tokens per step`), el("table", { class: `steer-steps steer-steps-${k}` },
      g.steps.map((step, s) => el("tr", {}, el("th", {}, `${s + 1}`), el("td", {}, el("div", { class: "chips" },
        (step.top || []).map((t) => el("span", { class: t.token === step.token ? "chosen" : "",
          title: `token ${t.token}` }, `${showToken(t.text)} ${fmt(t.probability, 3)}`))))))));
  }
  for (const note of r.notes || []) out.push(el("div", { class: "tag" }, "note: " + note));
  return out;
}

// ------------------------------------------------------------------ comparing two graphs (circuitgraph.diff)
function fillDiffChoices() {
  const others = state.graphs.filter((g) => g.name !== state.name);
  $("diff-section").hidden = !others.length;
  const select = $("diff-b"), keep = select.value;
  select.replaceChildren(...others.map((g) => el("option", { value: g.name }, g.name)));
  if (others.some((g) => g.name === keep)) select.value = keep;
  $("diff-clear").hidden = !state.diff;
}

async function showDiff() {
  const panel = $("details");
  panel.dataset.node = "diff";
  panel.dataset.state = "loading";
  const params = { a: state.name, b: $("diff-b").value, match: $("diff-match").value };
  if ($("diff-allow").checked) params.allow_different = "true";
  try {
    const d = await api("/api/diff?" + new URLSearchParams(params).toString());
    state.diff = d;
    fill(panel, diffPanel(d));
    panel.dataset.state = "ready";
  } catch (err) {
    state.diff = null;
    panel.replaceChildren(el("p", { class: "neg" }, err.message));
    panel.dataset.state = "error";
  }
  $("diff-clear").hidden = !state.diff;
  highlightDiff();
}

function diffKey(n, match) {  // a drawn node's key in the diff (queries/diff.py's _key_id)
  if (match === "identity") return `${n.kind}/${n.layer}/*/${n.index}`;
  if (match === "from_end") {
    const len = state.view.prompt_tokens ? state.view.prompt_tokens.length :
      Math.max(...state.view.nodes.map((m) => m.position)) + 1;
    return `${n.kind}/${n.layer}/${n.position - len}/${n.index}`;
  }
  return n.id;
}

function drawnNode(key) {
  if (!state.view || !state.diff) return null;
  return state.view.nodes.find((n) => diffKey(n, state.diff.match) === key) || null;
}

// the diff tables' columns: header, the value a click on the header sorts by (largest first), the cell
const DIFF_COLUMNS = [
  ["node", (r) => r.node, (r) => r.node + (r.token ? " " + showToken(r.token) : "") +
    (r.present === "both" ? "" : ` (only in ${r.present})`)],
  ["effect a → b", (r) => Math.max(Math.abs(r.effect_a), Math.abs(r.effect_b)),
    (r) => el("span", {}, signed(r.effect_a, 3), " → ", signed(r.effect_b, 3))],
  ["change", (r) => Math.abs(r.effect_difference), (r) => signed(r.effect_difference, 3)],
  ["flip", (r) => (r.sign_flip ? 1 : 0), (r) => (r.sign_flip ? el("span", { class: "neg flip" }, "FLIP") : "")],
];

function diffTable(id, rows, cls, sortBy) {
  const table = el("table", { id, class: "diff" });
  const draw = (column) => {
    const key = DIFF_COLUMNS[column][1];
    const sorted = rows.slice().sort((x, y) => {
      const a = key(x), b = key(y);
      // ties as the server orders them: by |change|, then by node id
      const tie = Math.abs(y.effect_difference) - Math.abs(x.effect_difference) || (x.node < y.node ? -1 : x.node > y.node ? 1 : 0);
      return typeof a === "number" ? b - a || tie : String(a) < String(b) ? -1 : String(a) > String(b) ? 1 : tie;
    });
    table.dataset.sortedBy = DIFF_COLUMNS[column][0];
    table.replaceChildren(el("tr", {}, DIFF_COLUMNS.map(([h], i) => el("th", { class: i === column ? "sorted" : "",
      title: `sort by ${h}`, onclick: () => draw(i) }, h))),
      ...sorted.slice(0, 100).map((r) => el("tr", { class: cls + (r.sign_flip ? " flipped" : ""), "data-node": r.node,
        title: `influence ${fmt(r.influence_a, 3)} → ${fmt(r.influence_b, 3)}; activation ${fmt(r.activation_a, 3)} → ` +
          fmt(r.activation_b, 3),
        onclick: () => {
          const n = drawnNode(r.node);
          if (n) selectNode(n.id);  // its inputs and outputs replace the diff panel; the highlights stay
        } }, DIFF_COLUMNS.map(([, , cell], i) => el("td", { class: i ? "num" : "" }, cell(r))))));
  };
  draw(sortBy);
  return table;
}

function diffPanel(d) {
  const c = d.counts;
  const [a, b] = d.names;
  const onlyA = d.nodes.filter((r) => r.present === "a");
  const onlyB = d.nodes.filter((r) => r.present === "b");
  const edgeRows = (d.top_edge_changes || []).map((e) => el("tr", { class: e.sign_flip ? "flipped" : "" },
    el("td", {}, `${e.source} → ${e.target}`), el("td", { class: "num" }, signed(e.weight_a, 3), " → ", signed(e.weight_b, 3)),
    el("td", { class: "num" }, signed(e.difference, 3)), el("td", {}, e.sign_flip ? el("span", { class: "neg flip" }, "FLIP") : "")));
  const out = [el("h3", {}, "diff"), el("div", { class: "tag" }, `a: ${a}`), el("div", { class: "tag" }, `b: ${b}`),
    el("div", { class: "tag" }, `match: ${d.match}`),
    factsTable([["nodes in both", c.nodes_both], ["nodes only in a", c.nodes_only_a], ["nodes only in b", c.nodes_only_b],
                ["edges in both", c.edges_both], ["edges only in a", c.edges_only_a], ["edges only in b", c.edges_only_b],
                ["nodes that flip sign", c.node_sign_flips], ["edges that flip sign", c.edge_sign_flips]]),
    ...(d.notes || []).map((n) => el("div", { class: "tag" }, "note: " + n)),
    el("h4", {}, `top ${d.top_changes.length} changes by |effect b − effect a|`),
    el("div", { class: "tag" }, "effect: the signed total effect on the targets; click a header to sort"),
    diffTable("diff-top", d.top_changes, "diff-top", 2),
    el("h4", {}, `top ${edgeRows.length} edge changes by |weight b − weight a|`),
    el("table", { id: "diff-edges", class: "diff" }, el("tr", {}, ["edge", "a → b", "change", "flip"].map((h) =>
      el("th", {}, h))), edgeRows)];
  for (const [title, rows, id] of [["only in a", onlyA, "diff-only-a"], ["only in b", onlyB, "diff-only-b"]]) {
    out.push(el("h4", {}, `nodes ${title} (${rows.length}${rows.length > 100 ? ", first 100" : ""})`),
      diffTable(id, rows, "diff-only", 2));
  }
  out.push(el("div", { class: "tag" }, "orange border: a top change; green: only in the graph shown"));
  return out;
}

function highlightDiff() {
  const d = state.diff;
  const top = new Set(d ? d.top_changes.map((r) => r.node) : []);
  const side = d && state.name === d.names[1] ? "b" : "a";
  const only = new Set(d ? d.nodes.filter((r) => r.present === side).map((r) => r.node) : []);
  const byId = new Map((state.view ? state.view.nodes : []).map((n) => [n.id, n]));
  for (const g of $("graph").querySelectorAll(".node")) {
    const n = byId.get(g.dataset.id);
    const key = d && n ? diffKey(n, d.match) : null;
    g.classList.toggle("changed", key !== null && top.has(key));
    g.classList.toggle("only", key !== null && only.has(key));
  }
}

// ------------------------------------------------------------------ feature dashboards without a graph
async function loadFeatures() {
  const info = await api("/api/features");
  $("features-section").hidden = false;
  $("features-source").textContent = info.source;
  const select = $("feature-layer");
  select.replaceChildren(...Object.entries(info.layers).map(([layer, n]) =>
    el("option", { value: layer }, `layer ${layer} (${n})`)));
  await listFeatures();
}

async function listFeatures() {
  const layer = $("feature-layer").value;
  if (layer === "") return;
  const answer = await api(`/api/features/${encodeURIComponent(layer)}?limit=300`);
  $("feature-list").replaceChildren(...answer.features.map((f) => el("div", { class: "item", "data-feature": f.index,
    onclick: () => showFeature(f.layer, f.index) }, el("span", { class: "grow" }, `F${f.index}` + (f.label ? " — " + f.label : "")),
    el("span", { class: "tag" }, f.density !== undefined ? `d=${fmt(f.density, 4)}` : ""))),
    answer.n_features > answer.features.length ? el("div", { class: "tag" },
      `${answer.features.length} of ${answer.n_features}; give an index above`) : "");
}

async function showFeature(layer, index) {
  const panel = $("details");
  panel.dataset.node = `feature ${layer} ${index}`;
  panel.dataset.state = "loading";
  try {
    const d = await api(`/api/features/${encodeURIComponent(layer)}/${encodeURIComponent(index)}`);
    fill(panel, dashboardPanel(d));
    panel.dataset.state = "ready";
  } catch (err) {
    panel.replaceChildren(el("p", { class: "neg" }, err.message));
    panel.dataset.state = "error";
  }
}

// ------------------------------------------------------------------ wiring
let sliderTimer = null;
function onSlider() {
  $("node-threshold-value").textContent = Number($("node-threshold").value).toFixed(2);
  $("edge-threshold-value").textContent = Number($("edge-threshold").value).toFixed(2);
  $("node-budget-value").textContent = budgetText();
  document.body.dataset.state = "loading";
  clearTimeout(sliderTimer);
  sliderTimer = setTimeout(() => loadView(false), 120);
}

$("graph-select").addEventListener("change", (ev) => selectGraph(ev.target.value));
$("node-threshold").addEventListener("input", onSlider);
$("edge-threshold").addEventListener("input", onSlider);
$("node-budget").addEventListener("input", onSlider);
$("show-remainders").addEventListener("change", () => { render(); runSearch(); showCounts(); });
$("search").addEventListener("input", runSearch);
$("search-kind").addEventListener("change", runSearch);
$("search-layer").addEventListener("change", runSearch);
$("group-button").addEventListener("click", groupPinned);
$("feature-layer").addEventListener("change", listFeatures);
$("feature-show").addEventListener("click", () => showFeature($("feature-layer").value, $("feature-index").value));
$("propose-button").addEventListener("click", propose);
$("diff-button").addEventListener("click", showDiff);
$("diff-clear").addEventListener("click", () => { state.diff = null; highlightDiff(); $("diff-clear").hidden = true; });
$("zoom-in").addEventListener("click", () => { state.zoom *= 1.25; render(); });
$("zoom-out").addEventListener("click", () => { state.zoom /= 1.25; render(); });
$("zoom-fit").addEventListener("click", () => { state.zoom = "fit"; render(); });
start();
