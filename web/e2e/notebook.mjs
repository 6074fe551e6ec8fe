// End-to-end test of kernelgate's browser notebook, in Debian's Chromium
// driven by playwright-core, against a running gateway (or a Jupyter Server
// behind web/dev, which serves the same page on one origin).
//
//   cd web && npm ci
//   KERNELGATE_URL=http://127.0.0.1:8888/ KERNELGATE_TOKEN=... node e2e/notebook.mjs
//
// Environment:
//   KERNELGATE_URL     the page (default http://127.0.0.1:8888/)
//   KERNELGATE_TOKEN   the gateway's token, typed into the page's prompt
//   CHROMIUM           the browser (default /usr/bin/chromium)
//   E2E_TIMEOUT_MS     the longest wait for one condition (default 60000)
//   E2E_SKIP_DENO=1    leave out the Deno steps
//   E2E_SKIP_R=1       leave out the R steps
//
// Every step waits on page conditions, never on fixed sleeps. Screenshots go
// to e2e/screenshots/. The run fails if the page sends any request to an
// origin other than KERNELGATE_URL's, or if the browser reports a Content
// Security Policy violation or an uncaught error.

import { mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const here = dirname(fileURLToPath(import.meta.url));
const BASE = new URL(process.env.KERNELGATE_URL || "http://127.0.0.1:8888/");
const TOKEN = process.env.KERNELGATE_TOKEN || "";
const BROWSER = process.env.CHROMIUM || "/usr/bin/chromium";
const T = Number(process.env.E2E_TIMEOUT_MS || 60000);
const SHOTS = join(here, "screenshots");
const ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

mkdirSync(SHOTS, { recursive: true });

// ---------------------------------------------------------------------------
// Reporting

const results = [];
let page;
let stopped = false;

/** Runs one step; a failed critical step stops the run (the rest depends on it). */
async function step(name, fn, { critical = false } = {}) {
  if (stopped) {
    results.push({ name, status: "not run" });
    return;
  }
  const t0 = Date.now();
  try {
    const note = await fn();
    if (note && note.skip) {
      results.push({ name, status: "skipped" });
      console.log(`skip - ${name}: ${note.skip}`);
      return;
    }
    results.push({ name, status: "passed" });
    console.log(`ok   - ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } catch (e) {
    results.push({ name, status: "failed", error: e });
    console.log(`FAIL - ${name}: ${e.message.split("\n")[0]}`);
    if (e.message.includes("\n")) console.log(e.message.split("\n").slice(1, 12).join("\n"));
    const shot = join(SHOTS, `failure-${name.replace(/[^a-z0-9]+/gi, "-").toLowerCase()}.png`);
    if (page) await page.screenshot({ path: shot }).then(() => console.log(`       screenshot: ${shot}`), () => {});
    if (critical) stopped = true;
  }
}

function check(cond, message) {
  if (!cond) throw new Error(message);
}

// ---------------------------------------------------------------------------
// Gateway API (from Node, as an agent would call it)

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (TOKEN) headers.Authorization = `token ${TOKEN}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const res = await fetch(new URL(path, BASE), { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    /* not JSON */
  }
  return { status: res.status, json, text };
}

// ---------------------------------------------------------------------------
// Page helpers

const tid = (id) => `[data-testid="${id}"]`;
const started = new Set(); // kernel ids this test started, shut down at the end
const contextsMade = [];

function notebook() {
  return page.locator(`${tid("notebook")}`);
}

async function waitStatus(state, timeout = T) {
  await page.locator(`${tid("kernel-status")}[data-state="${state}"]`).waitFor({ timeout });
}

/** Types code into the last cell, runs it with Shift+Enter and returns that cell. */
async function runCell(code, { wait = true } = {}) {
  const last = notebook().locator(tid("cell")).last();
  await last.waitFor();
  const id = await last.getAttribute("data-cell");
  const cell = notebook().locator(`${tid("cell")}[data-cell="${id}"]`);
  await cell.locator(".cm-content").click();
  await page.keyboard.insertText(code);
  const typed = await cell.locator(".cm-content").innerText();
  check(typed.replace(/\s+/g, "") === code.replace(/\s+/g, ""), `the editor holds ${JSON.stringify(typed)}, not the code typed`);
  const runs = Number((await cell.getAttribute("data-runs")) ?? 0);
  await page.keyboard.press("Shift+Enter");
  await page.locator(`${tid("cell")}[data-cell="${id}"][data-runs="${runs + 1}"]`).waitFor({ state: "attached", timeout: 5000 });
  if (wait) await cellDone(cell);
  return cell;
}

async function cellDone(cell, timeout = T) {
  await cell.and(page.locator('[data-state="done"], [data-state="error"]')).waitFor({ timeout });
}

async function startKernel(specName) {
  const button = page.locator(tid(`kernelspec-start-${specName}`));
  await button.waitFor({ timeout: T });
  await button.click();
  const nb = page.locator(`${tid("notebook")}[data-kernel-name="${specName}"]`);
  await nb.waitFor({ timeout: T });
  const id = await nb.getAttribute("data-kernel-id");
  started.add(id);
  await waitStatus("idle", T);
  return id;
}

async function shot(name, { height } = {}) {
  const size = page.viewportSize();
  if (height) await page.setViewportSize({ width: size.width, height });
  await page.screenshot({ path: join(SHOTS, name) });
  if (height) await page.setViewportSize(size);
}

/**
 * Runs code on a kernel as another client would: a second tab opens its own
 * kernel websocket (its own session) and sends an execute_request.
 */
async function runAsOtherClient(kernelId, code) {
  const other = await context.newPage();
  try {
    await other.goto(BASE.href);
    return await other.evaluate(
      async ({ kernelId, code, token }) => {
        const u = new URL(`api/kernels/${kernelId}/channels`, location.href);
        u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
        u.searchParams.set("session_id", crypto.randomUUID());
        if (token) u.searchParams.set("token", token);
        const ws = new WebSocket(u);
        await new Promise((resolve, reject) => {
          ws.onopen = resolve;
          ws.onerror = () => reject(new Error("the second client's websocket failed"));
        });
        const msgId = crypto.randomUUID();
        const header = { msg_id: msgId, msg_type: "execute_request", session: crypto.randomUUID(), username: "agent", date: new Date().toISOString(), version: "5.3" };
        const content = { code, silent: false, store_history: true, user_expressions: {}, allow_stdin: false, stop_on_error: true };
        ws.send(JSON.stringify({ header, parent_header: {}, metadata: {}, content, buffers: [], channel: "shell" }));
        const status = await new Promise((resolve) => {
          ws.onmessage = (ev) => {
            const m = JSON.parse(ev.data);
            if (m.channel === "shell" && m.parent_header.msg_id === msgId) resolve(m.content.status);
          };
        });
        ws.close();
        return status;
      },
      { kernelId, code, token: TOKEN },
    );
  } finally {
    await other.close();
  }
}

async function noToasts() {
  await page.locator(tid("toast")).first().waitFor({ state: "detached", timeout: T });
}

async function clickConfirmed(testid) {
  const b = page.locator(tid(testid));
  await b.click();
  await page.locator(`${tid(testid)}[data-armed="true"]`).waitFor({ timeout: 2000 });
  await b.click();
}

// ---------------------------------------------------------------------------
// The run

const profile = mkdtempSync(join(tmpdir(), "kernelgate-e2e-"));
const foreign = [];
const problems = [];
let blockedOutputScripts = 0;
let context;

try {
  context = await chromium.launchPersistentContext(profile, {
    executablePath: BROWSER,
    headless: true,
    args: ARGS,
    viewport: { width: 1360, height: 900 },
    deviceScaleFactor: 1,
  });
  context.on("request", (req) => {
    const u = new URL(req.url());
    if (["data:", "blob:", "about:"].includes(u.protocol)) return;
    if (u.origin !== BASE.origin) foreign.push(req.url());
  });
  page = context.pages()[0] ?? (await context.newPage());
  page.on("websocket", (ws) => {
    const u = new URL(ws.url());
    const http = u.protocol === "wss:" ? "https:" : "http:";
    if (`${http}//${u.host}` !== BASE.origin) foreign.push(ws.url());
  });
  page.on("console", (msg) => {
    const t = msg.text();
    if (!/Content Security Policy|Refused to/i.test(t)) return;
    // The HTML-output step shows a <script> that must not run: its frame
    // (about:srcdoc) reports the block. Anywhere else a violation is a bug.
    if (msg.location().url === "about:srcdoc" && /inline script/.test(t)) blockedOutputScripts++;
    else problems.push(`CSP: ${t} (${msg.location().url})`);
  });
  page.on("pageerror", (err) => problems.push(`page error: ${err.message}`));

  await step("open the page", async () => {
    const res = await page.goto(BASE.href);
    check(res && res.ok(), `GET ${BASE.href} answered ${res && res.status()}`);
    const csp = res.headers()["content-security-policy"] ?? "";
    check(csp.includes("default-src 'self'"), `no strict Content-Security-Policy on the page (got ${JSON.stringify(csp)})`);
    await page.locator(`${tid("token-dialog")}:visible, ${tid("kernelspec-list")} button`).first().waitFor({ timeout: T });
  }, { critical: true });

  await step("token prompt", async () => {
    const dialog = page.locator(tid("token-dialog"));
    if (!(await dialog.isVisible())) {
      if (TOKEN) console.log("       (the gateway did not ask for a token: auth is off)");
      return { skip: "the gateway requires no token" };
    }
    check(TOKEN, "the page asks for a token: set KERNELGATE_TOKEN");
    await shot("token-prompt.png");
    await page.locator(tid("token-input")).fill("not-the-token");
    await page.locator(tid("token-submit")).click();
    await page.locator(tid("token-error")).filter({ hasText: /not accepted/ }).waitFor({ timeout: T });
    await page.locator(tid("token-input")).fill(TOKEN);
    await page.locator(tid("token-submit")).click();
    await dialog.waitFor({ state: "hidden", timeout: T });
    await page.locator(`${tid("kernelspec-list")} button`).first().waitFor({ timeout: T });
    const kept = await page.evaluate(() => sessionStorage.getItem("kernelgate.token"));
    check(kept === TOKEN, "the token is not kept in sessionStorage");
    const inLocal = await page.evaluate(() => JSON.stringify(localStorage));
    check(!inLocal.includes(TOKEN), "the token leaked into localStorage");
  }, { critical: true });

  await step("start a python3 kernel", async () => {
    await startKernel("python3");
    await page.locator(`${tid("kernel-item")}[data-kernel-id="${[...started][0]}"]`).waitFor({ timeout: T });
  }, { critical: true });

  await step("1+1 shows 2", async () => {
    const cell = await runCell("1+1");
    await cell.locator(tid("output-result")).filter({ hasText: /^\s*2\s*$/ }).waitFor({ timeout: T });
    const prompt = await cell.locator(tid("cell-prompt")).innerText();
    check(/^\[\d+\]:$/.test(prompt), `prompt is ${prompt}`);
  });

  await step("an error shows its traceback with ANSI colours", async () => {
    const cell = await runCell("def f(x):\n    return 1 / x\nf(0)");
    const err = cell.locator(`${tid("output-error")}[data-ename="ZeroDivisionError"]`);
    await err.waitFor({ timeout: T });
    check((await err.innerText()).includes("return 1 / x"), "the traceback does not show the failing line");
    check((await err.locator('span[class*="ansi-"]').count()) > 0, "the traceback has no coloured spans");
    check(!(await err.innerText()).includes("\u001b["), "raw escape codes are shown");
  });

  await step("matplotlib plot shows an image", async () => {
    const cell = await runCell(
      "%matplotlib inline\nimport matplotlib.pyplot as plt\nimport numpy as np\nx = np.linspace(0, 6.3, 200)\nplt.figure(figsize=(6, 2.6))\nplt.plot(x, np.sin(x), label='sin')\nplt.plot(x, np.cos(x), label='cos')\nplt.legend(); plt.title('kernelgate'); plt.show()",
    );
    const img = cell.locator(tid("output-image"));
    await img.waitFor({ timeout: T });
    const w = await img.evaluate((el) => el.naturalWidth);
    check(w > 100, `the image is ${w} px wide`);
  });

  await step("HTML (sandboxed), markdown and JSON outputs", async () => {
    const cell = await runCell(
      "from IPython.display import HTML, Markdown, JSON, display\nimport pandas as pd\ndisplay(pd.DataFrame({'language': ['python', 'typescript'], 'kernels': [3, 1]}))\ndisplay(Markdown('**bold** and `code`'))\ndisplay(JSON({'ok': True, 'n': [1, 2]}))\ndisplay(HTML('<p id=x>html</p><script>document.getElementById(\"x\").textContent = \"script ran\"</script>'))",
    );
    const frames = cell.locator(tid("output-html-frame"));
    await frames.nth(1).waitFor({ timeout: T });
    for (let i = 0; i < 2; i++) {
      const sandbox = await frames.nth(i).getAttribute("sandbox");
      check(sandbox === "allow-scripts", `an HTML output frame has sandbox=${JSON.stringify(sandbox)}`);
    }
    const table = cell.frameLocator(`${tid("output-html-frame")} >> nth=0`);
    await table.locator("td", { hasText: "typescript" }).waitFor({ timeout: T });
    const second = cell.frameLocator(`${tid("output-html-frame")} >> nth=1`);
    await second.locator("#x").waitFor({ timeout: T });
    check((await second.locator("#x").innerText()) === "html", "a script in an HTML output ran (outputs are untrusted)");
    await page.waitForFunction(
      () => {
        const f = document.querySelector('[data-testid="output-html-frame"]');
        return f && f.getBoundingClientRect().height > 60;
      },
      null,
      { timeout: T },
    );
    await cell.locator(`${tid("output-markdown")} strong`, { hasText: "bold" }).waitFor({ timeout: T });
    await cell.locator(`${tid("output-json")}`, { hasText: '"ok"' }).waitFor({ timeout: T });
  });

  await step("progress: \\r, update_display_data and clear_output", async () => {
    const cell = await runCell(
      "import time\nfrom IPython.display import display, clear_output\nh = display('step 0/5', display_id=True)\nfor i in range(1, 6):\n    time.sleep(0.05)\n    h.update(f'step {i}/5')\n    print(f'\\r[{\"#\" * i}{\".\" * (5 - i)}] {i * 20}%', end='', flush=True)\nprint()\nfor i in range(3):\n    clear_output(wait=True)\n    print('tick', i)",
    );
    const streams = await cell.locator(tid("output-stream")).allInnerTexts();
    check(streams.join("|").trim() === "tick 2", `after clear_output(wait=True) the cell shows ${JSON.stringify(streams)}`);
    const cell2 = await runCell(
      "import time\nfrom IPython.display import display\nh = display('step 0/5', display_id=True)\nfor i in range(1, 6):\n    time.sleep(0.05)\n    h.update(f'step {i}/5')\n    print(f'\\r[{\"#\" * i}{\".\" * (5 - i)}] {i * 20}%', end='', flush=True)\nprint()",
    );
    const display = await cell2.locator(tid("output-display")).allInnerTexts();
    check(display.length === 1 && display[0].includes("step 5/5"), `the display shows ${JSON.stringify(display)}`);
    const bar = (await cell2.locator(tid("output-stream")).allInnerTexts()).join("");
    check(bar.trim() === "[#####] 100%", `the progress bar shows ${JSON.stringify(bar)}`);
  });

  await step("input() answered in the page", async () => {
    const cell = await runCell("name = input('name? ')\nprint('hello,', name)", { wait: false });
    const box = cell.locator(tid("stdin-input"));
    await box.waitFor({ timeout: T });
    check((await cell.locator(tid("output-stdin")).innerText()).includes("name?"), "the prompt text is not shown");
    await box.fill("kernelgate");
    await box.press("Enter");
    await cell.locator(tid("output-stream"), { hasText: "hello, kernelgate" }).waitFor({ timeout: T });
    await cellDone(cell);
  });

  await step("Tab completes from the kernel", async () => {
    await runCell("import collections");
    const cellId = await notebook().locator(tid("cell")).last().getAttribute("data-cell");
    const last = notebook().locator(`${tid("cell")}[data-cell="${cellId}"]`);
    await last.locator(".cm-content").click();
    await page.keyboard.insertText("collections.OrderedD");
    await page.keyboard.press("Tab");
    const option = page.locator(".cm-tooltip-autocomplete li", { hasText: "OrderedDict" });
    await option.first().waitFor({ timeout: T });
    // A click, not Enter: the editor ignores keys for the first 75 ms of a
    // completion list (CodeMirror's interactionDelay), so an Enter right
    // after it shows would be a newline.
    await option.first().click();
    const text = await last.locator(".cm-content").innerText();
    check(text.trim() === "collections.OrderedDict", `the completion left ${JSON.stringify(text)}`);
    await page.keyboard.press("Shift+Enter");
    await last.locator(tid("output-result"), { hasText: "collections.OrderedDict" }).waitFor({ timeout: T });
  });

  await step("interrupt a sleep", async () => {
    const cell = await runCell("import time\ntime.sleep(300)", { wait: false });
    await waitStatus("busy");
    await page.locator(tid("btn-interrupt")).click();
    await cell.locator(`${tid("output-error")}[data-ename="KeyboardInterrupt"]`).waitFor({ timeout: T });
    await cellDone(cell);
    await waitStatus("idle");
  });

  await step("reconnect after a dropped connection keeps the output", async () => {
    const cell = await runCell("import time\nfor i in range(12):\n    print('line', i, flush=True)\n    time.sleep(0.25)", { wait: false });
    await cell.locator(tid("output-stream"), { hasText: "line 1" }).waitFor({ timeout: T });
    await page.evaluate(() => window.kernelgate.dropConnections());
    await page.locator(`${tid("toast")}`, { hasText: "Reconnected" }).waitFor({ timeout: T });
    await cellDone(cell);
    check(
      (await cell.getAttribute("data-replied")) === "true",
      "the execute_reply sent while the page was disconnected never arrived: the server did not replay it on reconnect",
    );
    const text = await cell.locator(tid("output-stream")).innerText();
    for (let i = 0; i < 12; i++) {
      const n = text.split("\n").filter((l) => l.trim() === `line ${i}`).length;
      check(n === 1, `"line ${i}" appears ${n} times after the reconnect:\n${text}`);
    }
  });

  await step("restart the kernel", async () => {
    await runCell("before_restart = 1");
    await clickConfirmed("btn-restart");
    await page.locator(tid("toast"), { hasText: "Kernel restarted" }).waitFor({ timeout: T });
    await waitStatus("idle");
    const cell = await runCell("'before_restart' in globals()");
    await cell.locator(tid("output-result"), { hasText: "False" }).waitFor({ timeout: T });
    check((await cell.locator(tid("cell-prompt")).innerText()) === "[1]:", "the execution count did not start again at 1");
    await notebook().locator(tid("cell")).first().scrollIntoViewIfNeeded();
  });

  await step("a kernel that dies shows restarting, then idle", async () => {
    await page.evaluate(() => {
      const pill = document.querySelector('[data-testid="kernel-status"]');
      window.pillStates = [pill.dataset.state];
      new MutationObserver(() => window.pillStates.push(pill.dataset.state)).observe(pill, { attributeFilter: ["data-state"] });
    });
    const cell = await runCell("import os\nos._exit(1)", { wait: false });
    await cell.locator(tid("output-note"), { hasText: "restarting" }).waitFor({ timeout: T });
    await page.waitForFunction(() => window.pillStates.includes("restarting") && window.pillStates.at(-1) === "idle", null, { timeout: T });
    const after = await runCell("1+1");
    await after.locator(tid("output-result"), { hasText: "2" }).waitFor({ timeout: T });
  });

  await step("watch a run made by another client", async () => {
    const kernelId = await notebook().getAttribute("data-kernel-id");
    const status = await runAsOtherClient(kernelId, "print('hello from another client')\nfor i in range(3):\n    print('step', i)\n6 * 7");
    check(status === "ok", `the other client's run ended ${status}`);
    const ext = page.locator(tid("external-cell")).filter({ hasText: "hello from another client" });
    await ext.waitFor({ timeout: T });
    await ext.locator(tid("external-output"), { hasText: "42" }).waitFor({ timeout: T });
    check((await ext.locator(".cm-content").innerText()).includes("6 * 7"), "the external cell does not show the code that ran");
    await noToasts();
    await ext.scrollIntoViewIfNeeded();
    await shot("external-run.png");
  });

  await step("screenshot: python notebook", async () => {
    await noToasts();
    await page.locator(".main").evaluate((m) => (m.scrollTop = 0));
    await shot("notebook-python.png", { height: 1500 });
  });

  await step("a reload keeps the token and reopens the kernel", async () => {
    const id = await notebook().getAttribute("data-kernel-id");
    await page.reload();
    await page.locator(`${tid("notebook")}[data-kernel-id="${id}"]`).waitFor({ timeout: T });
    await waitStatus("idle");
    check(!(await page.locator(tid("token-dialog")).isVisible()), "the token was asked for again after a reload");
    const cell = await runCell("before_restart = 2\nbefore_restart * 21");
    await cell.locator(tid("output-result"), { hasText: "42" }).waitFor({ timeout: T });
  });

  // Contexts: the code-interpreter API (kernelgate only).
  const probe = await api("GET", "api/contexts");
  const haveContexts = probe.status === 200;
  if (!haveContexts) console.log(`       GET /api/contexts answered ${probe.status}: this server has no contexts, so the context steps are skipped`);

  async function contextStep(language, setup, code, expect) {
    if (!haveContexts) return { skip: `GET /api/contexts answered ${probe.status} (not kernelgate)` };
    const made = await api("POST", "api/contexts", { language });
    check(made.status === 201, `POST /api/contexts answered ${made.status}: ${made.text}`);
    const ctx = made.json;
    contextsMade.push(ctx.id);
    const warm = await api("POST", "api/execute", { code: setup, context: ctx.id, language });
    check(warm.status === 200, `POST /api/execute answered ${warm.status}: ${warm.text}`);
    await page.locator(tid("refresh")).click();
    const item = page.locator(`${tid("context-item")}[data-context-id="${ctx.id}"]:not([disabled])`);
    await item.waitFor({ timeout: T });
    await item.click();
    const kernelId = await item.getAttribute("data-kernel-id");
    await page.locator(`${tid("notebook")}[data-kernel-id="${kernelId}"]`).waitFor({ timeout: T });
    await page.locator(`${tid("connection-state")}[data-state="connected"]`).waitFor({ state: "attached", timeout: T });
    await waitStatus("idle");
    const run = await api("POST", "api/execute", { code, context: ctx.id, language });
    check(run.status === 200, `POST /api/execute answered ${run.status}: ${run.text}`);
    const ext = page.locator(tid("external-cell")).filter({ hasText: expect.stdout });
    await ext.waitFor({ timeout: T });
    if (expect.result) await ext.locator(tid("external-output"), { hasText: expect.result }).waitFor({ timeout: T });
    // R shows a value as HTML too, in a sandboxed frame.
    if (expect.htmlResult) await ext.frameLocator(tid("output-html-frame")).locator("body", { hasText: expect.htmlResult }).waitFor({ timeout: T });
    check((await ext.locator(".cm-content").innerText()).includes(expect.code), "the external cell does not show the code that ran");
    return ctx;
  }

  await step("watch a python context run through /api/execute", async () => {
    const r = await contextStep("python", "secret = 41", "print('hello from the API')\nsecret + 1", {
      stdout: "hello from the API",
      result: "42",
      code: "secret + 1",
    });
    if (r && r.skip) return r;
    // Take over: the page's own cell runs in the same kernel state.
    const cell = await runCell("secret * 2");
    await cell.locator(tid("output-result"), { hasText: "82" }).waitFor({ timeout: T });
    await noToasts();
    await shot("context-watch.png");
  });

  await step("the context's files: listed, uploaded by drag and drop, downloaded", async () => {
    if (!haveContexts || !contextsMade.length) return { skip: "no context opened (not kernelgate)" };
    const ctx = contextsMade[contextsMade.length - 1];
    const put = await fetch(new URL(`api/contexts/${ctx}/files/data/sales.csv`, BASE), {
      method: "PUT",
      headers: { Authorization: `token ${TOKEN}` },
      body: "region,sales\nnorth,10\nsouth,32\n",
    });
    check(put.status === 201, `PUT answered ${put.status}`);
    const section = page.locator(tid("files-section"));
    await section.waitFor({ state: "visible", timeout: T });
    await page.locator(tid("refresh")).click();
    const folder = section.locator(`${tid("file-item")}[data-path="data"]`);
    await folder.waitFor({ timeout: T });
    await folder.click();
    const csv = section.locator(`${tid("file-item")}[data-path="data/sales.csv"]`);
    await csv.waitFor({ timeout: T });
    const [download] = await Promise.all([page.waitForEvent("download", { timeout: T }), csv.click()]);
    check(download.suggestedFilename() === "sales.csv", `download named ${download.suggestedFilename()}`);
    check(readFileSync(await download.path(), "utf8").startsWith("region,sales"), "the downloaded file differs");
    // Drop a file on the panel: it lands in the folder shown.
    await section.evaluate((el) => {
      const dt = new DataTransfer();
      dt.items.add(new File(["dropped in the page"], "dropped.txt", { type: "text/plain" }));
      el.dispatchEvent(new DragEvent("dragover", { dataTransfer: dt, bubbles: true, cancelable: true }));
      el.dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
    });
    await section.locator(`${tid("file-item")}[data-path="data/dropped.txt"]`).waitFor({ timeout: T });
    const cell = await runCell("import pandas as pd\nprint(open('data/dropped.txt').read())\npd.read_csv('data/sales.csv').sales.sum()");
    await cell.locator(tid("output-stream"), { hasText: "dropped in the page" }).waitFor({ timeout: T });
    await cell.locator(tid("output-result"), { hasText: "42" }).waitFor({ timeout: T });
    await noToasts();
    await shot("context-files.png");
  });

  await step("the context's command box: run, output, exit code, kill", async () => {
    if (!haveContexts || !contextsMade.length) return { skip: "no context opened (not kernelgate)" };
    const section = page.locator(tid("command-section"));
    await section.waitFor({ state: "visible", timeout: T });
    const input = section.locator(tid("command-input"));
    const status = section.locator(tid("command-status"));
    await input.fill("echo made by a command > from-command.txt; ls data; echo warning >&2; exit 3");
    await section.locator(tid("command-run")).click();
    await status.filter({ hasText: "exit code 3" }).waitFor({ timeout: T });
    const out = await section.locator(tid("command-output")).innerText();
    check(out.includes("sales.csv") && out.includes("warning"), `command output ${JSON.stringify(out)}`);
    // The command's file is in the workspace the kernel works in.
    const cell = await runCell("print(open('from-command.txt').read())");
    await cell.locator(tid("output-stream"), { hasText: "made by a command" }).waitFor({ timeout: T });
    await input.fill("echo waiting; sleep 300");
    await section.locator(tid("command-run")).click();
    await section.locator(tid("command-output"), { hasText: "waiting" }).waitFor({ timeout: T });
    await section.locator(tid("command-kill")).click();
    await status.filter({ hasText: "killed, exit code 137" }).waitFor({ timeout: T });
    await noToasts();
    await shot("context-command.png");
  });

  await step("start a deno kernel and run 1+1", async () => {
    if (process.env.E2E_SKIP_DENO === "1") return { skip: "E2E_SKIP_DENO=1" };
    await startKernel("deno");
    const cell = await runCell("1+1");
    await cell.locator(tid("output-result")).filter({ hasText: /^\s*2\s*$/ }).waitFor({ timeout: T });
    const cell2 = await runCell("const langs: string[] = ['python', 'typescript'];\nconsole.log(`deno ${Deno.version.deno}`);\nlangs.map((l) => l.toUpperCase())");
    await cell2.locator(tid("output-stream"), { hasText: "deno " }).waitFor({ timeout: T });
    await cell2.locator(tid("output-result"), { hasText: "TYPESCRIPT" }).waitFor({ timeout: T });
    await noToasts();
    await shot("notebook-deno.png");
  });

  await step("watch a deno context run through /api/execute", async () => {
    if (process.env.E2E_SKIP_DENO === "1") return { skip: "E2E_SKIP_DENO=1" };
    return contextStep("typescript", "let base = 40;", "console.log('deno says hi');\nbase + 2", {
      stdout: "deno says hi",
      result: "42",
      code: "base + 2",
    });
  });

  await step("start an R kernel: output, a data frame and a plot inline", async () => {
    if (process.env.E2E_SKIP_R === "1") return { skip: "E2E_SKIP_R=1" };
    await startKernel("ir");
    // R is highlighted: keywords and strings get their own spans.
    const cell = await runCell("sales <- c(north = 10, south = 32)\nif (TRUE) cat('total', sum(sales), '\\n')\ndata.frame(region = names(sales), sales = unname(sales))");
    check((await cell.locator(".cm-content span", { hasText: "TRUE" }).count()) > 0, "R code is not highlighted");
    await cell.locator(tid("output-stream"), { hasText: "total 42" }).waitFor({ timeout: T });
    const table = cell.frameLocator(`${tid("output-html-frame")} >> nth=0`);
    await table.locator("td", { hasText: "south" }).waitFor({ timeout: T });
    const plot = await runCell("plot(1:10, (1:10)^2, type = 'b', main = 'kernelgate')");
    const img = plot.locator(tid("output-image"));
    await img.waitFor({ timeout: T });
    const w = await img.evaluate((el) => el.naturalWidth);
    check(w > 100, `the plot is ${w} px wide`);
    const err = await runCell("stop('boom')");
    await err.locator(tid("output-error"), { hasText: "boom" }).waitFor({ timeout: T });
    await noToasts();
    await shot("notebook-r.png");
  });

  await step("watch an R context run through /api/execute", async () => {
    if (process.env.E2E_SKIP_R === "1") return { skip: "E2E_SKIP_R=1" };
    return contextStep("r", "base <- 40", "cat('R says hi\\n')\nbase + 2", {
      stdout: "R says hi",
      htmlResult: "42",
      code: "base + 2",
    });
  });

  await step("shut a kernel down from the page", async () => {
    const id = [...started][0];
    await page.locator(`${tid("kernel-item")}[data-kernel-id="${id}"]`).click();
    await page.locator(`${tid("notebook")}[data-kernel-id="${id}"]`).waitFor({ timeout: T });
    await clickConfirmed("btn-shutdown");
    await page.locator(tid("welcome")).waitFor({ timeout: T });
    await page.locator(`${tid("kernel-item")}[data-kernel-id="${id}"]`).waitFor({ state: "detached", timeout: T });
    const res = await api("GET", `api/kernels/${id}`);
    check(res.status === 404, `the kernel still exists after shut down (GET answered ${res.status})`);
    started.delete(id);
  });

  await step("the page sent nothing to other origins and broke no policy", async () => {
    check(foreign.length === 0, `requests to other origins:\n${foreign.join("\n")}`);
    check(problems.length === 0, problems.join("\n"));
    check(blockedOutputScripts >= 1, "the script in the HTML output was not reported as blocked");
  });
} catch (e) {
  results.push({ name: "browser", status: "failed", error: e });
  console.log(`FAIL - ${e.message}`);
} finally {
  for (const id of started) await api("DELETE", `api/kernels/${id}`).catch(() => {});
  for (const id of contextsMade) await api("DELETE", `api/contexts/${id}`).catch(() => {});
  await context?.close().catch(() => {});
  rmSync(profile, { recursive: true, force: true });
}

const count = (s) => results.filter((r) => r.status === s).length;
const notRun = count("not run");
console.log(`\nscreenshots in ${SHOTS}${notRun ? `; ${notRun} steps not run after the failure` : ""}`);
console.log(`${count("passed")} passed, ${count("failed")} failed, ${count("skipped")} skipped`);
process.exit(count("failed") || notRun ? 1 : 0);
