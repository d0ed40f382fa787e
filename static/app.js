// ray-dashd's UI: the module overview and the log viewer. Plain modern
// JavaScript, no build step. Every URL is relative, so the page works at `/`,
// at `/dashd/` and behind a reverse proxy that mounts it under a prefix.

// The page is served at the root (`/`, or the URL prefix's `/ray/`) and at
// `dashd/` under it; the API is beside the root. (`../api/` from the root
// works at `/` only, where `..` stops.)
const API = new URL(
  new URL(".", document.baseURI).pathname.endsWith("/dashd/") ? "../api/" : "api/",
  document.baseURI,
);
const POLL_MS = 1000;          // overview refresh: a change shows within 2 s
const FILES_POLL_MS = 5000;    // log file list refresh
const INITIAL_LINES = 2000;    // lines loaded when a file is opened
const KEEP_LINES = 20000;      // lines kept in memory per open file
const SHOW_LINES = 5000;       // lines kept in the page (filter applies first)
const RECONNECT_MS = 1000;     // pause before re-opening a dropped tail

const $ = (selector) => document.querySelector(selector);

function apiUrl(path) {
  return new URL(path, API);
}

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

function formatDuration(ms) {
  if (ms == null) return "—";
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} m ${s % 60} s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h} h ${m % 60} m`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

function formatRtt(us) {
  if (us == null) return "—";
  return us < 1000 ? `${us} µs` : `${(us / 1000).toFixed(1)} ms`;
}

function formatBytes(bytes) {
  if (bytes == null) return "—";
  const mib = bytes / (1024 * 1024);
  return mib < 1024 ? `${mib.toFixed(mib < 10 ? 1 : 0)} MiB` : `${(mib / 1024).toFixed(1)} GiB`;
}

function formatTime(ms) {
  return ms == null ? "" : new Date(ms).toLocaleTimeString();
}

function setConnection(ok, text) {
  const conn = $("#conn");
  conn.textContent = text;
  conn.classList.toggle("down", !ok);
}

// === Overview ===

const rows = new Map(); // module name -> { row, history, cells, ... }

function moduleRow(name) {
  if (rows.has(name)) return rows.get(name);
  const cells = {
    name: el("th", { scope: "row" }),
    state: el("td"),
    pid: el("td", { class: "num" }),
    incarnation: el("td", { class: "num" }),
    restarts: el("td", { class: "num" }),
    uptime: el("td", { class: "num" }),
    rtt: el("td", { class: "num" }),
    memory: el("td", { class: "num" }),
    error: el("td", { class: "error" }),
    routes: el("td", { class: "routes" }),
    actions: el("td", { class: "actions" }),
  };
  const historyToggle = el("button", { type: "button", class: "link", "aria-expanded": "false" }, name);
  cells.name.append(historyToggle);
  const restart = el("button", { type: "button", class: "restart" }, "Restart");
  restart.addEventListener("click", () => confirmRestart(name));
  cells.actions.append(restart);
  const row = el("tr", { dataset: { module: name } }, ...Object.values(cells));
  const historyCell = el("td", { colspan: "11" });
  const history = el("tr", { class: "history", hidden: "" }, historyCell);
  historyToggle.addEventListener("click", () => {
    const open = history.hidden;
    history.hidden = !open;
    historyToggle.setAttribute("aria-expanded", String(open));
  });
  const entry = { row, history, historyCell, cells, restart };
  rows.set(name, entry);
  return entry;
}

function renderModule(m) {
  const { cells, historyCell, restart } = moduleRow(m.name);
  const badge = el("span", { class: `state state-${m.state}` }, m.state);
  if (m.state === "backoff" && m.next_start_at_ms) {
    const wait = Math.max(0, m.next_start_at_ms - Date.now());
    badge.title = `next start in ${formatDuration(wait)}`;
  } else if (m.state === "dormant") {
    badge.title = "started on demand: no process until the first request for one of its routes";
  } else if (m.state === "waiting") {
    badge.title = "alive, waiting for something outside it; not restarted for it" +
      (m.backoff_ms ? ` (it tries again every ${formatDuration(m.backoff_ms)})` : "");
  }
  if (m.busy_since_ms != null) {
    // Computing (its health checks unanswered while it uses CPU): kept,
    // not restarted, until busy_max_secs.
    badge.append(el("span", { class: "busy" }, " · busy"));
    badge.title = `busy for ${formatDuration(Date.now() - m.busy_since_ms)}: ` +
      "its health checks go unanswered while it computes; it is not restarted for that";
  }
  cells.state.replaceChildren(badge);
  cells.pid.textContent = m.pid ?? "—";
  cells.incarnation.textContent = m.incarnation ?? "—";
  cells.restarts.textContent = m.restarts;
  cells.uptime.textContent = formatDuration(m.uptime_ms);
  cells.rtt.textContent = formatRtt(m.last_health_rtt_us);
  cells.memory.textContent = formatBytes(m.memory_bytes);
  cells.memory.title = m.memory_budget_bytes != null
    ? `budget ${formatBytes(m.memory_budget_bytes)}: past it the module is restarted`
    : "resident memory of its processes; no budget";
  // While it starts or waits, why it is not ready (in its own words) says
  // more than how it last failed.
  const why = m.reason ?? m.last_error ?? "";
  cells.error.textContent = why;
  cells.error.title = why;
  cells.error.classList.toggle("not-ready", m.reason != null);
  const routeText = m.routes.map((r) => `${r.method} ${r.path} (${r.type})`).join("\n");
  cells.routes.textContent = m.routes.length === 1 ? "1 route" : `${m.routes.length} routes`;
  cells.routes.title = routeText;
  restart.disabled = m.state === "stopping" || m.state === "stopped";
  restart.setAttribute("aria-label", `Restart ${m.name}`);

  const events = [...m.events].reverse().map((e) =>
    el("li", {}, el("time", {}, formatTime(e.at_ms)), ` #${e.incarnation} `,
      el("span", { class: `event event-${e.kind}` }, e.kind), " ", e.detail));
  const routes = m.routes.map((r) => el("li", {}, el("code", {}, `${r.method} ${r.path}`), ` ${r.type}`));
  historyCell.replaceChildren(
    el("div", { class: "history-grid" },
      el("div", {}, el("h3", {}, "Recent events"), el("ul", { class: "events" }, ...events)),
      el("div", {}, el("h3", {}, "Routes"), el("ul", { class: "route-list" }, ...routes),
        el("h3", {}, "Command"), el("code", { class: "command" }, m.command.join(" ")),
        el("h3", {}, "Socket"), el("code", {}, m.socket))));
}

function renderOverview(modules) {
  const body = $("#modules tbody");
  const seen = new Set();
  const ordered = [];
  for (const m of modules) {
    renderModule(m);
    seen.add(m.name);
    const { row, history } = rows.get(m.name);
    ordered.push(row, history);
  }
  for (const name of [...rows.keys()]) if (!seen.has(name)) rows.delete(name);
  // Re-append only when the order changed, so focus and open rows survive.
  const current = [...body.children];
  if (current.length !== ordered.length || current.some((node, i) => node !== ordered[i])) {
    body.replaceChildren(...ordered);
  }
  $("#no-modules").hidden = modules.length > 0;
  const counts = {};
  for (const m of modules) counts[m.state] = (counts[m.state] ?? 0) + 1;
  $("#summary").replaceChildren(...Object.entries(counts).map(([state, n]) =>
    el("span", { class: `pill state-${state}` }, `${n} ${state}`)));
  renderRayLinks(modules);
  refreshRayClients(modules);
}

// The Ray Client proxy's clients, when a module serves them.
const CLIENTS_PATH = "/api/client_proxy/clients";

async function refreshRayClients(modules) {
  const proxy = modules.find((m) => m.routes.some((r) => r.method === "GET" && r.path === CLIENTS_PATH));
  $("#ray-clients").hidden = !proxy;
  if (!proxy) return;
  if (proxy.state !== "healthy") {
    // Its routes answer 503 until it is ready; its state says why.
    $("#ray-clients-status").textContent =
      `The Ray Client proxy is ${proxy.state}` + (proxy.reason || proxy.last_error ? `: ${proxy.reason ?? proxy.last_error}` : ".");
    $("#ray-clients-status").classList.add("bad");
    $("#ray-clients tbody").replaceChildren();
    $("#no-ray-clients").hidden = true;
    return;
  }
  let view;
  try {
    const response = await fetch(apiUrl(CLIENTS_PATH.slice("/api/".length)), { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    view = await response.json();
  } catch (error) {
    $("#ray-clients-status").textContent = `The Ray Client proxy does not answer (${error.message}).`;
    $("#ray-clients-status").classList.add("bad");
    return;
  }
  const status = $("#ray-clients-status");
  status.classList.toggle("bad", !view.listen);
  status.textContent = view.listen
    ? `ray://${view.listen} · ${view.num_clients} client${view.num_clients === 1 ? "" : "s"} · ` +
      `${view.ports_in_use} server port${view.ports_in_use === 1 ? "" : "s"} in use` +
      (view.warm_spare ? ` · spare server ${view.spare_ready ? "ready" : "starting"}` : "")
    : (view.error ?? "The Ray Client port is not bound yet.");
  const rows = view.clients.map((c) => el("tr", { dataset: { client: c.id } },
    el("td", {}, el("code", {}, c.id)),
    el("td", {}, el("span", { class: `state state-${c.server_state === "ready" ? "healthy" : c.server_state === "failed" ? "unhealthy" : "starting"}` }, c.server_state),
      c.error ? el("div", { class: "error" }, c.error) : null),
    el("td", { class: "num" }, c.server_pid == null ? "—" : String(c.server_pid)),
    el("td", { class: "num" }, c.server_port == null ? "—" : String(c.server_port)),
    el("td", {}, formatTime(c.connected_since * 1000)),
    el("td", {}, c.attached ? (c.reconnected ? "reconnected" : "connected") : "dropped; within grace period")));
  $("#ray-clients tbody").replaceChildren(...rows);
  $("#no-ray-clients").hidden = rows.length > 0;
}

// Links to the data of Ray's own modules, when ray-dashd hosts them.
const RAY_LINKS = [
  ["/api/jobs/", "Jobs"],
  ["/nodes", "Nodes", "?view=summary"],
  ["/api/cluster_status", "Cluster status"],
  ["/api/v0/actors", "Actors"],
  ["/api/v0/tasks/summarize", "Task summary"],
  ["/api/v0/placement_groups", "Placement groups"],
  ["/api/serve/applications/", "Serve applications"],
  ["/api/version", "Version"],
];

function renderRayLinks(modules) {
  const served = new Set();
  for (const m of modules) for (const r of m.routes) if (r.method === "GET") served.add(r.path);
  const links = RAY_LINKS.filter(([path]) => served.has(path)).map(([path, label, query = ""]) =>
    el("li", {}, el("a", { href: new URL(`..${path}${query}`, API).href }, label)));
  $("#ray-links").hidden = links.length === 0;
  $("#ray-links ul").replaceChildren(...links);
}

// Whether Ray's modules are hosted, and if not why: set at start-up, so
// read until it answers once.
let rayStatus = null;

async function refreshRayStatus() {
  if (rayStatus) return;
  try {
    const response = await fetch(apiUrl("dashd/status"), { cache: "no-store" });
    if (!response.ok) return;
    rayStatus = (await response.json()).ray;
  } catch {
    return;
  }
  const line = $("#ray-status");
  const shown = rayStatus && rayStatus.state !== "off";
  line.hidden = !shown;
  if (!shown) return;
  line.classList.toggle("bad", rayStatus.state === "not_hosted");
  const python = rayStatus.python && rayStatus.state === "hosted"
    ? ` · Python ${rayStatus.python} (${rayStatus.python_source})` : "";
  line.textContent = rayStatus.message + python;
}

async function refreshOverview() {
  refreshRayStatus();
  try {
    const response = await fetch(apiUrl("modules"), { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    renderOverview(await response.json());
    setConnection(true, `live · ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    setConnection(false, `cannot reach ray-dashd (${error.message}); retrying`);
  }
}

let restartTarget = null;

function confirmRestart(name) {
  restartTarget = name;
  $("#confirm-name").textContent = name;
  $("#confirm-restart").showModal();
  $("#confirm-ok").focus();
}

$("#confirm-restart").addEventListener("close", async () => {
  const dialog = $("#confirm-restart");
  if (dialog.returnValue !== "restart" || !restartTarget) return;
  const name = restartTarget;
  restartTarget = null;
  try {
    const response = await fetch(apiUrl(`modules/${encodeURIComponent(name)}/restart`), { method: "POST" });
    const body = await response.json().catch(() => ({}));
    setConnection(response.ok, response.ok ? `restarting ${name}` : (body.message ?? `restart failed: HTTP ${response.status}`));
  } catch (error) {
    setConnection(false, `restart failed: ${error.message}`);
  }
  refreshOverview();
});

// === Logs ===

const logs = {
  files: [],
  name: null,
  lines: [],
  socket: null,
  generation: 0,
  filter: "",
};

async function refreshFiles() {
  try {
    const response = await fetch(apiUrl("dashd/logs/files"), { cache: "no-store" });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body.message ?? `HTTP ${response.status}`);
    }
    const { files } = await response.json();
    logs.files = files;
    $("#logs-unavailable").hidden = true;
    renderFiles();
  } catch (error) {
    $("#logs-unavailable").hidden = false;
    $("#logs-unavailable").textContent = `The logs module is not available: ${error.message}`;
  }
}

function formatSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

function renderFiles() {
  const needle = $("#file-filter").value.toLowerCase();
  const items = logs.files
    .filter((f) => f.name.toLowerCase().includes(needle))
    .map((f) => {
      const item = el("li", {
        role: "option",
        tabindex: "0",
        "aria-selected": String(f.name === logs.name),
        dataset: { name: f.name },
        title: `${f.name}\n${formatSize(f.size)}, modified ${new Date(f.modified_ms).toLocaleString()}`,
      }, el("span", { class: "file-name" }, f.name), el("span", { class: "file-size" }, formatSize(f.size)));
      item.addEventListener("click", () => openFile(f.name));
      item.addEventListener("keydown", (event) => {
        if (event.key === "Enter" || event.key === " ") { event.preventDefault(); openFile(f.name); }
        if (event.key === "ArrowDown") { event.preventDefault(); item.nextElementSibling?.focus(); }
        if (event.key === "ArrowUp") { event.preventDefault(); item.previousElementSibling?.focus(); }
      });
      return item;
    });
  $("#file-list").replaceChildren(...items);
}

function openFile(name) {
  const hash = `#/logs/${encodeURIComponent(name)}`;
  if (location.hash !== hash) location.hash = hash; // route() opens it
  else loadFile(name);
}

function closeTail() {
  logs.generation += 1;
  if (logs.socket) {
    logs.socket.onclose = null;
    logs.socket.close();
    logs.socket = null;
  }
}

async function loadFile(name) {
  closeTail();
  const generation = logs.generation;
  logs.name = name;
  logs.lines = [];
  partial = "";
  $("#viewer-name").textContent = name;
  $("#log").replaceChildren();
  renderFiles();
  setViewerStatus("loading…");
  let offset = 0;
  try {
    const url = apiUrl("dashd/logs/file");
    url.search = new URLSearchParams({ name, lines: INITIAL_LINES });
    const response = await fetch(url, { cache: "no-store" });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body.message ?? `HTTP ${response.status}`);
    }
    const text = await response.text();
    if (generation !== logs.generation) return;
    offset = Number(response.headers.get("x-next-offset") ?? 0);
    appendText(text);
  } catch (error) {
    if (generation === logs.generation) setViewerStatus(`cannot read ${name}: ${error.message}`, true);
    return;
  }
  tail(name, offset, generation);
}

function tail(name, offset, generation) {
  const url = apiUrl("dashd/logs/ws");
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  url.search = new URLSearchParams({ name, offset });
  const socket = new WebSocket(url);
  logs.socket = socket;
  socket.onopen = () => setViewerStatus("following");
  socket.onmessage = (event) => appendText(event.data);
  socket.onclose = (event) => {
    if (generation !== logs.generation) return;
    logs.socket = null;
    setViewerStatus(`tail closed${event.reason ? `: ${event.reason}` : ""}; reconnecting`, true);
    setTimeout(() => { if (generation === logs.generation) loadFile(name); }, RECONNECT_MS);
  };
}

function setViewerStatus(text, bad = false) {
  const status = $("#viewer-status");
  status.textContent = text;
  status.classList.toggle("bad", bad);
}

let partial = "";

function appendText(text) {
  if (!text) return;
  const pieces = (partial + text).split("\n");
  partial = pieces.pop();
  if (pieces.length === 0) return;
  logs.lines.push(...pieces);
  if (logs.lines.length > KEEP_LINES) logs.lines.splice(0, logs.lines.length - KEEP_LINES);
  const fragment = document.createDocumentFragment();
  for (const line of pieces) if (matches(line)) fragment.append(lineNode(line));
  const log = $("#log");
  log.append(fragment);
  while (log.childElementCount > SHOW_LINES) log.firstElementChild.remove();
  if ($("#follow").checked) log.scrollTop = log.scrollHeight;
}

function matches(line) {
  return !logs.filter || line.toLowerCase().includes(logs.filter);
}

function lineNode(line) {
  const node = el("div", { class: "line" }, line || "\u200b");
  if (/\b(ERROR|FATAL|CRITICAL)\b|\bpanicked\b/.test(line)) node.classList.add("line-error");
  else if (/\bWARN(ING)?\b/.test(line)) node.classList.add("line-warn");
  return node;
}

function renderLines() {
  const shown = logs.lines.filter(matches).slice(-SHOW_LINES);
  const fragment = document.createDocumentFragment();
  for (const line of shown) fragment.append(lineNode(line));
  const log = $("#log");
  log.replaceChildren(fragment);
  if ($("#follow").checked) log.scrollTop = log.scrollHeight;
}

let filterTimer = null;
$("#line-filter").addEventListener("input", (event) => {
  clearTimeout(filterTimer);
  filterTimer = setTimeout(() => { logs.filter = event.target.value.toLowerCase(); renderLines(); }, 120);
});
$("#file-filter").addEventListener("input", renderFiles);
$("#follow").addEventListener("change", (event) => {
  if (event.target.checked) $("#log").scrollTop = $("#log").scrollHeight;
});
$("#log").addEventListener("scroll", () => {
  const log = $("#log");
  const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 4;
  if ($("#follow").checked !== atBottom) $("#follow").checked = atBottom;
});

// === Routing and keys ===

let timers = [];

function route() {
  const hash = location.hash || "#/overview";
  const [view, ...rest] = hash.slice(2).split("/");
  const logsView = view === "logs";
  $("#view-overview").hidden = logsView;
  $("#view-logs").hidden = !logsView;
  $("#nav-overview").setAttribute("aria-current", logsView ? "false" : "page");
  $("#nav-logs").setAttribute("aria-current", logsView ? "page" : "false");
  for (const timer of timers) clearInterval(timer);
  if (logsView) {
    refreshFiles();
    timers = [setInterval(refreshFiles, FILES_POLL_MS)];
    const name = rest.length ? decodeURIComponent(rest.join("/")) : null;
    if (name && name !== logs.name) loadFile(name);
  } else {
    closeTail();
    logs.name = null;
    refreshOverview();
    timers = [setInterval(refreshOverview, POLL_MS)];
  }
}

document.addEventListener("keydown", (event) => {
  const typing = event.target.closest("input, textarea, dialog");
  if (event.key === "Escape" && typing) { event.target.blur(); return; }
  if (typing || event.ctrlKey || event.metaKey || event.altKey) return;
  if (event.key === "1") location.hash = "#/overview";
  else if (event.key === "2") location.hash = "#/logs";
  else if (event.key === "/" && !$("#view-logs").hidden) { event.preventDefault(); $("#line-filter").focus(); }
});

window.addEventListener("hashchange", route);
route();
