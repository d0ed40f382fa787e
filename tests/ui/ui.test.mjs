// The UI in a real headless Chromium: the overview shows the modules and
// follows a restart without a reload, the restart action asks first, the log
// viewer tails a file live, a module waiting for a port another process
// holds says so, one started on demand shows dormant until asked, and the
// page logs no console errors.
//
// Needs: RAY_DASHD_BIN_DIR (the built ray-dashd, ray-dashd-logs and
// ray-dashd-test-module; default target/debug) and Chromium at
// RAY_DASHD_CHROMIUM (default /usr/bin/chromium). scripts/test sets both up,
// and runs the walk a second time with RAY_DASHD_UI_PREFIX (ray-dashd's
// --url-prefix, the page opened under it).

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const urlPrefix = process.env.RAY_DASHD_UI_PREFIX ?? "";
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const binDir = path.resolve(root, process.env.RAY_DASHD_BIN_DIR ?? "target/debug");
const chromiumPath = process.env.RAY_DASHD_CHROMIUM ?? "/usr/bin/chromium";
const shots = path.join(root, "target", urlPrefix ? "ui-screenshots-prefix" : "ui-screenshots");
const WAIT_MS = 15000;
// Ports for the client proxy's (fake) Ray client servers.
// Above the kernel's ephemeral range (32768–60999).
const serverPorts = (() => { const first = 64700 + (process.pid % 6) * 50; return `${first}-${first + 49}`; })();

let tmp, session, dashd, base, browser, page, holder;
const consoleErrors = [];

function config(takenPort) {
  const routes = (list) => list.map(([m, p, t]) => `  { method = "${m}", path = "${p}", type = "${t}" },`).join("\n");
  return `
[[modules]]
name = "logs"
command = ["${path.join(binDir, "ray-dashd-logs")}"]
routes = [
${routes([
    ["GET", "/api/dashd/logs/files", "http"],
    ["GET", "/api/dashd/logs/file", "http"],
    ["GET", "/api/dashd/logs/follow", "stream"],
    ["GET", "/api/dashd/logs/ws", "websocket"],
  ])}
]

[[modules]]
name = "tm"
command = ["${path.join(binDir, "ray-dashd-test-module")}"]
routes = [
${routes([["GET", "/test/info", "http"], ["GET", "/test/ws/echo", "websocket"]])}
]

[[modules]]
name = "ray_client_proxy"
command = ["${path.join(binDir, "ray-dashd-client-proxy")}", "--ray-client-port", "0", "--warm-spare", "false",
  "--server-command", "${path.join(binDir, "ray-dashd-fake-client-server")}", "--port-range", "${serverPorts}"]
routes = [
${routes([["GET", "/api/client_proxy/clients", "http"]])}
]

# Started on demand: dormant until a request for its route.
[[modules]]
name = "lazy"
start = "on_demand"
command = ["${path.join(binDir, "ray-dashd-test-module")}"]
routes = [
${routes([["GET", "/test/count", "http"]])}
]

# A second proxy whose port this test holds, as Ray's own proxier would.
[[modules]]
name = "taken_proxy"
command = ["${path.join(binDir, "ray-dashd-client-proxy")}", "--ray-client-port", "${takenPort}", "--warm-spare", "false",
  "--server-command", "${path.join(binDir, "ray-dashd-fake-client-server")}", "--port-range", "${serverPorts}"]
routes = []
`;
}

async function startDashd(takenPort) {
  const file = path.join(tmp, "dashd.toml");
  fs.writeFileSync(file, config(takenPort));
  const child = spawn(path.join(binDir, "ray-dashd"),
    ["--session-dir", session, "--port", "0", "--config", file,
      ...(urlPrefix ? ["--url-prefix", urlPrefix] : [])],
    { stdio: ["ignore", "ignore", "pipe"] });
  const lines = readline.createInterface({ input: child.stderr });
  const addr = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("ray-dashd did not start listening")), WAIT_MS);
    lines.on("line", (line) => {
      const match = /ray-dashd listening addr=(\S+)/.exec(line);
      if (match) { clearTimeout(timer); resolve(match[1]); }
    });
    child.on("exit", (code) => reject(new Error(`ray-dashd exited with ${code}`)));
    // A binary that cannot be run (not built, say) is named, not timed out.
    child.on("error", (error) => reject(new Error(`ray-dashd did not start: ${error.message}`)));
  });
  lines.on("line", () => {}); // keep draining stderr
  return { child, addr };
}

async function cell(module, column) {
  return page.locator(`tr[data-module="${module}"] > :nth-child(${column})`).innerText();
}

before(async () => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), "rdui"));
  session = path.join(tmp, "s");
  fs.mkdirSync(shots, { recursive: true });
  holder = net.createServer();
  await new Promise((resolve) => holder.listen(0, "127.0.0.1", resolve));
  const started = await startDashd(holder.address().port);
  dashd = started.child;
  base = `http://${started.addr}${urlPrefix}`;
  browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  page = await browser.newPage({ viewport: { width: 1440, height: 900 } });
  page.on("console", (message) => { if (message.type() === "error") consoleErrors.push(message.text()); });
  page.on("pageerror", (error) => consoleErrors.push(String(error)));
});

after(async () => {
  await browser?.close();
  if (dashd && dashd.exitCode === null) {
    const exited = new Promise((resolve) => dashd.on("exit", resolve));
    dashd.kill("SIGTERM");
    await Promise.race([exited, new Promise((r) => setTimeout(r, WAIT_MS))]);
    if (dashd.exitCode === null) dashd.kill("SIGKILL");
  }
  holder?.close();
  fs.rmSync(tmp, { recursive: true, force: true });
});

test("overview lists the modules as healthy", async () => {
  await page.goto(`${base}/`);
  for (const name of ["logs", "tm"]) {
    await page.locator(`tr[data-module="${name}"] .state-healthy`).waitFor({ timeout: WAIT_MS });
  }
  assert.match(await page.locator("#conn").innerText(), /live/);
  await page.screenshot({ path: path.join(shots, "overview.png") });
});

test("a killed module's restart shows without a reload", async () => {
  const pid = Number(await cell("tm", 3));
  assert.ok(pid > 0);
  assert.equal(await cell("tm", 4), "0");
  let navigations = 0;
  page.on("framenavigated", () => { navigations += 1; });
  process.kill(pid, "SIGKILL");
  await page.waitForFunction(({ old }) => {
    const row = document.querySelector('tr[data-module="tm"]');
    const pidNow = Number(row?.children[2].textContent);
    return row && row.children[3].textContent === "1" && pidNow > 0 && pidNow !== old
      && row.querySelector(".state-healthy");
  }, { old: pid }, { timeout: WAIT_MS });
  assert.equal(navigations, 0, "the page reloaded");
  assert.match(await cell("tm", 9), /SIGKILL/);
  // The memory its processes hold, from the host's samples.
  await page.waitForFunction(() =>
    /MiB/.test(document.querySelector('tr[data-module="tm"] > :nth-child(8)')?.textContent ?? ""),
    null, { timeout: WAIT_MS });
  await page.getByRole("button", { name: "tm", exact: true }).click();
  await page.locator("tr.history:not([hidden])", { hasText: "Recent events" }).waitFor();
  await page.screenshot({ path: path.join(shots, "overview-after-restart.png") });
  await page.getByRole("button", { name: "tm", exact: true }).click();
});

test("the restart action asks for confirmation first", async () => {
  await page.getByRole("button", { name: "Restart tm" }).click();
  const dialog = page.locator("#confirm-restart");
  await dialog.waitFor({ state: "visible" });
  await dialog.getByRole("button", { name: "Cancel" }).click();
  await dialog.waitFor({ state: "hidden" });
  assert.equal(await cell("tm", 4), "1", "cancel restarted the module");
  await page.getByRole("button", { name: "Restart tm" }).click();
  await dialog.getByRole("button", { name: "Restart" }).click();
  await page.waitForFunction(() =>
    document.querySelector('tr[data-module="tm"]')?.children[3].textContent === "2", null, { timeout: WAIT_MS });
});

test("the keyboard switches views", async () => {
  await page.locator("body").press("2");
  await page.locator("#view-logs").waitFor({ state: "visible" });
  await page.locator("body").press("1");
  await page.locator("#view-overview").waitFor({ state: "visible" });
});

test("the log viewer tails a file live and filters it", async () => {
  await page.getByRole("link", { name: /Logs/ }).click();
  const item = page.locator('#file-list li[data-name="dashboard_tm.err"]');
  await item.waitFor({ timeout: WAIT_MS });
  await item.click();
  await page.locator("#viewer-status", { hasText: "following" }).waitFor({ timeout: WAIT_MS });
  const marker = `ui-test-line-${Date.now()}`;
  fs.appendFileSync(path.join(session, "logs", "dashboard_tm.err"), `${marker}\n`);
  // The acceptance bound: a new line shows within 2 s.
  await page.locator("#log .line", { hasText: marker }).waitFor({ timeout: 2000 });
  await page.screenshot({ path: path.join(shots, "logs.png") });

  await page.locator("#line-filter").fill(marker);
  await page.waitForFunction((m) => {
    const lines = [...document.querySelectorAll("#log .line")];
    return lines.length === 1 && lines[0].textContent === m;
  }, marker, { timeout: WAIT_MS });
});

test("the Ray clients panel shows the proxy and a connected client", async () => {
  await page.goto(`${base}/`);
  const status = page.locator("#ray-clients-status", { hasText: "ray://127.0.0.1:" });
  await status.waitFor({ timeout: WAIT_MS });
  assert.match(await status.innerText(), /0 clients/);
  await page.locator("#no-ray-clients").waitFor({ state: "visible" });
  const listen = /ray:\/\/(\S+)/.exec(await status.innerText())[1];
  const client = spawn(path.join(binDir, "ray-dashd-fake-client"), [listen, "ui-test-client"],
    { stdio: ["pipe", "pipe", "inherit"] });
  try {
    const row = page.locator('#ray-clients tr[data-client="ui-test-client"]');
    await row.locator(".state-healthy", { hasText: "ready" }).waitFor({ timeout: WAIT_MS });
    assert.match(await row.innerText(), /connected/);
    assert.match(await status.innerText(), /1 client\b/);
    await page.locator("#ray-clients").screenshot({ path: path.join(shots, "ray-clients.png") });
  } finally {
    client.stdin.end();
    await Promise.race([new Promise((r) => client.on("exit", r)), new Promise((r) => setTimeout(r, WAIT_MS))]);
    if (client.exitCode === null) client.kill("SIGKILL");
  }
  await page.locator("#no-ray-clients").waitFor({ state: "visible", timeout: WAIT_MS });
});

test("a module waiting for a taken port says who holds it, as does the Ray line", async () => {
  await page.goto(`${base}/`);
  await page.locator('tr[data-module="taken_proxy"] .state-waiting').waitFor({ timeout: WAIT_MS });
  const why = await cell("taken_proxy", 9);
  assert.match(why, new RegExp(`is taken by pid ${process.pid} \\(`));
  assert.match(why, /--ray-client-server-port/);
  // No Ray head in this session: the overview says Ray's modules are not hosted.
  const ray = page.locator("#ray-status");
  await ray.waitFor({ state: "visible", timeout: WAIT_MS });
  assert.match(await ray.innerText(), /not hosted/);
  await page.screenshot({ path: path.join(shots, "overview-waiting.png") });
});

test("a module started on demand shows dormant until a request starts it", async () => {
  await page.goto(`${base}/`);
  const dormant = page.locator('tr[data-module="lazy"] .state-dormant');
  await dormant.waitFor({ timeout: WAIT_MS });
  assert.match(await dormant.getAttribute("title"), /no process until the first request/);
  assert.equal(await cell("lazy", 3), "—"); // no pid
  const status = await page.evaluate(async (url) => (await fetch(url)).status, `${base}/test/count`);
  assert.equal(status, 200);
  // The overview follows it to healthy without a reload.
  await page.locator('tr[data-module="lazy"] .state-healthy').waitFor({ timeout: WAIT_MS });
  await page.screenshot({ path: path.join(shots, "overview-woken.png") });
});

test("the page logged no console errors", () => {
  assert.deepEqual(consoleErrors, []);
});
