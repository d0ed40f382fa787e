"use strict";
const fmtMs = (ms) => ms == null ? "" : ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(0)} s`;
function cell(text, cls) { const td = document.createElement("td"); td.textContent = text ?? ""; if (cls) td.className = cls; return td; }
async function refresh() {
  try {
    const response = await fetch("api/modules", { cache: "no-store" });
    const modules = await response.json();
    const body = document.querySelector("#modules tbody");
    body.replaceChildren(...modules.map((m) => {
      const tr = document.createElement("tr");
      tr.append(cell(m.name), cell(m.state, `state-${m.state}`), cell(m.pid), cell(m.incarnation), cell(m.restarts),
        cell(fmtMs(m.uptime_ms)), cell(m.last_health_rtt_us == null ? "" : `${m.last_health_rtt_us} µs`), cell(m.last_error));
      return tr;
    }));
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    document.getElementById("updated").textContent = `cannot reach ray-dashd: ${e}`;
  }
}
refresh();
setInterval(refresh, 1000);
