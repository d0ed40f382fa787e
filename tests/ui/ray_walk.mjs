// Ray's own web UI, walked page by page in headless Chromium on two
// dashboards that serve the same cluster: Ray's (the reference) and
// ray-dashd hosting Ray's modules. Each page is opened on both, left until
// its requests have settled, and compared: the text it shows (with what
// changes by itself between two renders masked: clocks, durations, usage
// figures, the order of a JSON object's keys), the API requests it made
// and how each was answered, and the errors it logged. A page whose text differs is snapshot again, both
// sides, until the two agree or the rounds run out (the cluster moves on
// between the two reads). The two must not share a session folder: both
// put their modules' sockets at `<session>/sockets/dash_<Module>`, and the
// one that binds last answers for both.
//
//   node tests/ui/ray_walk.mjs [--shots DIR] [--token T] [--settle-ms N]
//        [--page-timeout-ms N] [--rounds N] REFERENCE_BASE CANDIDATE_BASE
//
// Prints one line per page and exits 0 when every page agrees, 1 when one
// does not (the differences are printed), 2 on bad usage. Needs Chromium at
// RAY_DASHD_CHROMIUM (default /usr/bin/chromium) and playwright-core
// (`npm ci --prefix tests/ui`). tests/ray_scale.rs runs it on a small
// synthetic cluster; bench/ray_scale.sh on the big one (BENCH_UI_WALK=1).

import fs from "node:fs";
import path from "node:path";
import { chromium } from "playwright-core";

const usage = "usage: ray_walk.mjs [--shots DIR] [--token T] [--settle-ms N] " +
  "[--page-timeout-ms N] [--rounds N] REFERENCE_BASE CANDIDATE_BASE";

function parseArgs(argv) {
  const opts = { shots: null, token: null, settleMs: 1500, pageTimeoutMs: 60000, rounds: 4, bases: [] };
  const numeric = { "--settle-ms": "settleMs", "--page-timeout-ms": "pageTimeoutMs", "--rounds": "rounds" };
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i];
    if (arg === "--shots" || arg === "--token" || arg in numeric) {
      const value = argv[i + 1];
      if (value === undefined) throw new Error(`${arg} needs a value`);
      i += 1;
      if (arg in numeric) {
        const n = Number(value);
        if (!Number.isInteger(n) || n < 1) throw new Error(`${arg}: not a positive integer: ${value}`);
        opts[numeric[arg]] = n;
      } else {
        opts[arg.slice(2)] = value;
      }
    } else if (arg.startsWith("--")) {
      throw new Error(`unknown option ${arg}`);
    } else {
      opts.bases.push(arg.replace(/\/+$/, ""));
    }
  }
  if (opts.bases.length !== 2) throw new Error("two base URLs are needed");
  return opts;
}

// Text that differs between two renders of the same state: a clock, an age,
// a duration, a usage figure, a rate. Each is replaced by a placeholder of
// its kind, so the words around it and the structure still compare.
const VOLATILE = [
  [/\b\d{4}[-/]\d{2}[-/]\d{2}[ T,]+\d{1,2}:\d{2}(:\d{2})?(\.\d+)?( ?[AP]M)?( ?(UTC|GMT|Z)[+-]?\d*)?/g, "<time>"],
  [/\b\d{1,2}\/\d{1,2}\/\d{2,4},? \d{1,2}:\d{2}(:\d{2})?( ?[AP]M)?/g, "<time>"],
  [/\b\d{1,2}:\d{2}:\d{2}( ?[AP]M)?/g, "<time>"],
  [/\b(\d+(\.\d+)?\s*(d|h|m|s|ms|min|mins|hour|hours|day|days|sec|secs|seconds?|minutes?)\s*)+(ago)?\b/g, "<duration>"],
  // An age under a second is shown in words ("Updated just now").
  [/\bjust now\b/g, "<duration>"],
  [/\b\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\b/g, "<size>"],
  [/\b\d+(\.\d+)?\s*%/g, "<pct>"],
  [/\b\d+(\.\d+)?\s*(\/s|per second)\b/g, "<rate>"],
  [/\b\d+\.\d+\/\d+\.\d+\/\d+\.\d+\b/g, "<load>"],
];

// A JSON object shown as a line (an actor's resources) lists its keys in
// the order its process's protobuf map gave them, which differs between
// two processes: its keys are sorted.
function sortedKeys(value) {
  if (Array.isArray(value)) return value.map(sortedKeys);
  if (value === null || typeof value !== "object") return value;
  return Object.fromEntries(Object.keys(value).sort().map((k) => [k, sortedKeys(value[k])]));
}

function jsonLine(line) {
  if (!line.startsWith("{") || !line.endsWith("}")) return line;
  try {
    return JSON.stringify(sortedKeys(JSON.parse(line)));
  } catch {
    return line;
  }
}

function normalize(text) {
  let out = text;
  for (const [pattern, placeholder] of VOLATILE) out = out.replace(pattern, placeholder);
  return out.split("\n").map((line) => jsonLine(line.replace(/\s+/g, " ").trim())).filter(Boolean);
}

// What a page shows and asks, once its requests have settled.
async function snapshot(context, base, route, opts) {
  const page = await context.newPage();
  const requests = new Map();
  const errors = [];
  let inFlight = 0;
  let lastActivity = Date.now();
  const api = (url) => url.startsWith(base) && !/\.(js|css|png|svg|ico|woff2?|ttf|map|json)$/.test(new URL(url).pathname)
    ? url.slice(base.length) : null;
  page.on("request", (request) => { inFlight += 1; lastActivity = Date.now(); });
  const done = () => { inFlight = Math.max(0, inFlight - 1); lastActivity = Date.now(); };
  page.on("requestfailed", (request) => {
    done();
    const key = api(request.url());
    if (key !== null) requests.set(key, `failed: ${request.failure()?.errorText}`);
  });
  page.on("requestfinished", async (request) => {
    done();
    const key = api(request.url());
    if (key === null) return;
    try {
      const response = await request.response();
      requests.set(key, response ? String(response.status()) : "no response");
    } catch {
      // The page was closed before the answer could be read: not counted.
    }
  });
  // The same error on both sides names each side's own address.
  const origin = new URL(base).origin;
  const error = (text) => errors.push(text.replaceAll(origin, "<base>"));
  page.on("console", (message) => { if (message.type() === "error") error(message.text()); });
  page.on("pageerror", (e) => error(String(e)));
  const started = Date.now();
  await page.goto(`${base}/#${route}`, { timeout: opts.pageTimeoutMs });
  // Settled: nothing in flight, nothing new for settleMs (the UI polls, so
  // the quiet gap is what marks a render complete), and the text the same
  // as settleMs before (React renders after the answers), within the bound.
  const quiet = () => inFlight === 0 && Date.now() - lastActivity >= opts.settleMs;
  let settled = false;
  let text = "";
  let previous = null;
  while (Date.now() - started < opts.pageTimeoutMs) {
    if (quiet()) {
      text = await page.locator("body").innerText();
      const now = normalize(text).join("\n");
      if (now === previous && quiet()) { settled = true; break; }
      previous = now;
      await page.waitForTimeout(opts.settleMs);
    } else {
      await page.waitForTimeout(100);
    }
  }
  if (!settled) text = await page.locator("body").innerText();
  if (opts.shots) {
    const stem = path.join(opts.shots, `${route.replace(/[^a-z0-9]+/gi, "_")}-${new URL(base).port}`);
    // A picture to look at, not a thing compared: one that cannot be taken
    // (a page of thousands of rows can take Chromium longer than the
    // screenshot's 30 s) is said on stderr, and the walk goes on.
    try {
      await page.screenshot({ path: `${stem}.png`, fullPage: true });
    } catch (e) {
      console.error(`${route} on ${base}: no screenshot: ${String(e.message).split("\n")[0]}`);
    }
    fs.writeFileSync(`${stem}.json`, JSON.stringify({ text: text.split("\n"), requests: Object.fromEntries(requests), errors }, null, 1));
  }
  await page.close();
  return { text: normalize(text), requests, errors, settled, ms: Date.now() - started };
}

// The lines only one side shows, each side's first few.
function textDiff(a, b) {
  const inB = new Set(b);
  const inA = new Set(a);
  return { onlyA: a.filter((l) => !inB.has(l)), onlyB: b.filter((l) => !inA.has(l)) };
}

function compare(a, b) {
  const problems = [];
  // A page that keeps polling and never goes quiet on Ray's own dashboard
  // either (the cluster page of 2,000 nodes) is compared as it stands at
  // the timeout; the candidate alone never settling is a difference.
  if (!b.settled && a.settled) problems.push(`candidate never settled within ${b.ms} ms; the reference did in ${a.ms} ms`);
  const { onlyA, onlyB } = textDiff(a.text, b.text);
  if (onlyA.length || onlyB.length) {
    problems.push(`text differs: reference only ${JSON.stringify(onlyA.slice(0, 5))}, ` +
      `candidate only ${JSON.stringify(onlyB.slice(0, 5))}`);
  }
  // Every request both made is answered alike; the candidate fails none the
  // reference answered.
  for (const [key, status] of b.requests) {
    const ref = a.requests.get(key);
    if (ref !== undefined && ref !== status) problems.push(`${key}: ${status} (reference ${ref})`);
    if (ref === undefined && !/^[23]/.test(status)) problems.push(`${key}: ${status} (reference did not ask)`);
  }
  const newErrors = b.errors.filter((e) => !a.errors.includes(e));
  if (newErrors.length) problems.push(`console errors: ${JSON.stringify(newErrors.slice(0, 3))}`);
  return problems;
}

// The pages: every top-level view, plus one node, one actor and one job
// taken from the cluster itself, asked of each base in turn until one
// answers with some, for up to a page's timeout (a dashboard just started
// may list none yet: on a big cluster Ray's modules take a while to read
// 10,000 actors, and one may be slow to answer).
async function routes(requests, bases, timeout) {
  const list = ["/overview", "/cluster", "/jobs", "/actors", "/serve", "/metrics", "/logs"];
  const first = async (p, pick) => {
    const deadline = Date.now() + timeout;
    let why = [];
    do {
      why = [];
      for (const [i, base] of bases.entries()) {
        try {
          const r = await requests[i].get(`${base}${p}`, { timeout });
          const found = r.ok() ? pick(await r.json()) : null;
          if (found) return found;
          why.push(`${base}${p}: ${r.ok() ? "none in the answer" : `status ${r.status()}`}`);
        } catch (e) {
          why.push(`${base}${p}: ${e.message.split("\n")[0]}`);
        }
      }
      await new Promise((done) => setTimeout(done, 3000));
    } while (Date.now() < deadline);
    console.error(`ids: none listed for ${p} in ${timeout} ms, its page is not walked (${why.join("; ")})`);
    return null;
  };
  const node = await first("/nodes?view=summary", (answer) => {
    const summary = answer?.data?.summary ?? [];
    const head = summary.find((n) => n?.raylet?.isHeadNode) ?? summary[0];
    return head?.raylet?.nodeId;
  });
  if (node) list.push(`/cluster/nodes/${node}`);
  const actor = await first("/logical/actors", (answer) => Object.keys(answer?.data?.actors ?? {}).sort()[0]);
  if (actor) list.push(`/actors/${actor}`);
  const job = await first("/api/jobs/", (answer) => Array.isArray(answer)
    ? answer.map((j) => j.job_id ?? j.submission_id).filter(Boolean).sort()[0] : null);
  if (job) list.push(`/jobs/${job}`);
  return list;
}

async function main() {
  let opts;
  try { opts = parseArgs(process.argv.slice(2)); } catch (e) { console.error(`${e.message}\n${usage}`); process.exit(2); }
  if (opts.shots) fs.mkdirSync(opts.shots, { recursive: true });
  const browser = await chromium.launch({
    executablePath: process.env.RAY_DASHD_CHROMIUM ?? "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  let failed = 0;
  try {
    const headers = opts.token ? { Authorization: `Bearer ${opts.token}` } : {};
    const contexts = await Promise.all(opts.bases.map(() =>
      browser.newContext({ viewport: { width: 1440, height: 900 }, extraHTTPHeaders: headers, timezoneId: "UTC", locale: "en-US" })));
    const list = await routes(contexts.map((c) => c.request), opts.bases, opts.pageTimeoutMs);
    for (const route of list) {
      let problems = [];
      let a;
      let b;
      for (let round = 0; round < opts.rounds; round += 1) {
        [a, b] = await Promise.all(opts.bases.map((base, i) => snapshot(contexts[i], base, route, opts)));
        problems = compare(a, b);
        if (problems.length === 0) break;
      }
      const asked = [...b.requests.keys()].length;
      if (problems.length === 0) {
        const unsettled = a.settled && b.settled ? "" : " (compared at the timeout: never quiet)";
        console.log(`same\t${route}\t${a.text.length} lines, ${asked} requests, ${a.ms} / ${b.ms} ms${unsettled}`);
      } else {
        failed += 1;
        console.log(`DIFFERS\t${route}\t${problems.join("; ")}`);
      }
    }
  } finally {
    await browser.close();
  }
  process.exit(failed ? 1 : 0);
}

await main();
