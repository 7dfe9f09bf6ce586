// The web console end to end: Debian's chromium, driven by playwright-core, against the real
// daemon scripts/console-tests.sh started. One page walks every view in order, as a user would;
// each view leaves a screenshot in $CONSOLE_SHOTS.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, readFile } from "node:fs/promises";
import { chromium } from "playwright-core";

const base = process.env.DAEMON_URL;
const key = process.env.DAEMON_KEY1;
const adminKey = process.env.KODER_ADMIN_KEY;
const shots = process.env.CONSOLE_SHOTS;
const origin = new URL(base).host;

let browser;
let page;
const foreign = [];
const problems = [];
const urls = [];

before(async () => {
  await mkdir(shots, { recursive: true });
  // As root chromium needs --no-sandbox; the page only ever sees the loopback daemon.
  browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox"] });
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 }, acceptDownloads: true });
  page = await context.newPage();
  page.setDefaultTimeout(10_000);
  page.on("request", (r) => {
    urls.push(r.url());
    if (new URL(r.url()).host !== origin) foreign.push(r.url());
  });
  page.on("websocket", (ws) => {
    urls.push(ws.url());
    if (new URL(ws.url()).host !== origin) foreign.push(ws.url());
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error" && /Content Security Policy|Refused to/.test(m.text())) problems.push(`${page.url().replace(/^.*#/, "#")} ${JSON.stringify(m.location())}: ${m.text().slice(0, 120)}`);
  });
});

after(async () => {
  await browser?.close();
});

// The steps build on each other: after a failure the rest are skipped, not timed out one by one.
let broken = false;
function step(name, fn) {
  test(name, async (t) => {
    if (broken) return t.skip("an earlier step failed");
    try {
      await fn();
    } catch (e) {
      broken = true;
      await shot(`failed-${name.replace(/\W+/g, "-")}`).catch(() => {});
      throw e;
    }
  });
}

const shot = (name) => page.screenshot({ path: `${shots}/${name}.png`, fullPage: true });

/** Every control on the page has an accessible name. */
async function assertLabelled() {
  const unlabelled = await page.evaluate(() =>
    [...document.querySelectorAll("input, select, textarea, button")]
      .filter((el) => !el.closest(".xterm"))
      .filter((el) => !(el.labels?.length || el.getAttribute("aria-label") || el.textContent.trim()))
      .map((el) => el.outerHTML),
  );
  assert.deepEqual(unlabelled, []);
}

async function run(command) {
  await page.getByLabel("Command (bash)").fill(command);
  await page.getByLabel("Command (bash)").press("Enter");
  await page.locator(".result", { hasText: "exit code" }).waitFor();
}

step("sign in with an API key", async () => {
  const res = await page.goto(`${base}/console`);
  const csp = res.headers()["content-security-policy"];
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /frame-ancestors 'none'/);
  assert.equal(res.headers()["x-content-type-options"], "nosniff");
  await page.getByRole("heading", { name: "Sign in" }).waitFor();
  await assertLabelled();
  await shot("signin");
  // Keyboard only: the page focuses its heading, the next stop is the key field.
  await page.keyboard.press("Tab");
  assert.equal(await page.evaluate(() => document.activeElement?.getAttribute("name")), "api-key");
  await page.keyboard.type("not-a-key");
  await page.keyboard.press("Enter");
  await page.getByText("This key is not valid.").waitFor();
  await page.getByLabel("API key").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("heading", { name: "Sessions" }).waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.getItem("koder.console.key")), key);
});

let sessionId;

step("create a session and see it listed with state, limits and usage", async () => {
  await page.getByLabel("Memory (MiB)").fill("256");
  await page.getByLabel("Network").selectOption("open");
  await page.getByRole("button", { name: "Create session" }).click();
  const created = await page.getByText(/^Created session /).textContent();
  sessionId = created.replace(/^Created session /, "").replace(/\.$/, "");
  const row = page.locator("tr", { has: page.getByRole("link", { name: sessionId }) });
  await row.getByText("running").waitFor();
  await row.getByText("256 MiB").waitFor();
  await row.getByText(/cpu [\d.]+ s · mem/).waitFor();
  await assertLabelled();
  await shot("sessions");
});

step("run python and see its coloured output, exit code and duration", async () => {
  await page.getByRole("link", { name: sessionId }).click();
  await page.getByRole("heading", { name: `Session ${sessionId}` }).waitFor();
  await run(`/usr/bin/python3 -c 'print("\\033[31mhello from python\\033[0m", 6*7)'`);
  const output = page.getByRole("log", { name: "Command output" });
  await output.getByText("hello from python").waitFor();
  assert.match(await output.textContent(), /hello from python 42/);
  assert.equal(await output.locator("span.fg1").textContent(), "hello from python");
  assert.match(await page.locator(".result").textContent(), /^exit code 0 · \d+ ms$/);
  await assertLabelled();
  await shot("exec");
  // Sandbox output is text, never markup.
  await run(`printf '<img src=x onerror="document.title=1">'; exit 3`);
  assert.equal(await output.textContent(), '<img src=x onerror="document.title=1">');
  assert.equal(await output.locator("img").count(), 0);
  assert.match(await page.locator(".result").textContent(), /^exit code 3/);
});

step("type in the terminal and see the echo", async () => {
  await page.getByRole("link", { name: "Terminal" }).click();
  await page.getByText("Connected.").waitFor();
  await page.keyboard.type("echo koder-$((6*7))\n");
  await page.locator(".xterm-rows", { hasText: "koder-42" }).waitFor();
  await shot("terminal");
});

step("upload a file and download it back", async () => {
  await page.getByRole("link", { name: "Files" }).click();
  await page.getByRole("table", { name: "Files in /workspace" }).waitFor();
  const content = `uploaded from the console ${Date.now()}\n`;
  await page.getByLabel("Files to upload").setInputFiles({ name: "hello.txt", mimeType: "text/plain", buffer: Buffer.from(content) });
  await page.getByRole("button", { name: "Upload", exact: true }).click();
  await page.getByText("Uploaded hello.txt.").waitFor();
  await page.getByRole("cell", { name: "hello.txt", exact: true }).waitFor();
  const [download] = await Promise.all([page.waitForEvent("download"), page.getByRole("button", { name: "Download hello.txt" }).click()]);
  assert.equal(download.suggestedFilename(), "hello.txt");
  assert.equal(await readFile(await download.path(), "utf8"), content);
  await assertLabelled();
  await shot("files");
});

step("see CPU and memory charts", async () => {
  // Something to chart: a background exec (through the API, as any client) that burns CPU and
  // holds memory for a few seconds.
  const started = await page.evaluate(async (id) => {
    const res = await fetch(`/v1/sandbox/sessions/${id}/exec`, {
      method: "POST",
      headers: { Authorization: `Bearer ${sessionStorage.getItem("koder.console.key")}`, "Content-Type": "application/json" },
      body: JSON.stringify({
        cmd: ["/usr/bin/python3", "-c", "import time\nx = bytearray(48 << 20)\nend = time.time() + 5\nwhile time.time() < end: pass"],
        background: true,
      }),
    });
    return res.status;
  }, sessionId);
  assert.equal(started, 202);
  await page.getByRole("link", { name: "Metrics" }).click();
  await page.getByRole("img", { name: /^Memory: [\d.]+ MiB now/ }).waitFor();
  await page.getByRole("img", { name: /^CPU: / }).waitFor();
  await page.getByRole("img", { name: /^Memory: [1-9]\d\.\d MiB now/ }).waitFor();
  await page.waitForTimeout(2000);
  await shot("metrics");
});

step("see an audit entry of a refused connection", async () => {
  await page.getByRole("link", { name: "Exec" }).click();
  // A private address: the egress guard refuses it even in open mode, and audits the attempt.
  await run(`/usr/bin/python3 -c 'import socket; print(socket.socket().connect_ex(("10.255.0.1", 8125)))'`);
  await page.getByRole("navigation", { name: "Session views" }).getByRole("link", { name: "Network audit" }).click();
  await page.getByRole("cell", { name: "10.255.0.1:8125", exact: true }).waitFor();
  await page.locator("tr", { hasText: "10.255.0.1:8125" }).getByText("refused").waitFor();
  await assertLabelled();
  await shot("audit");
});

step("see what happened to the session, followed to its end", async () => {
  // An exec killed by its time limit is an event (made through the API, as any client).
  const call = (path, method, body) =>
    page.evaluate(
      async ([path, method, body]) => {
        const res = await fetch(path, {
          method,
          headers: { Authorization: `Bearer ${sessionStorage.getItem("koder.console.key")}`, "Content-Type": "application/json" },
          body: body && JSON.stringify(body),
        });
        return res.status;
      },
      [path, method, body],
    );
  assert.equal(await call(`/v1/sandbox/sessions/${sessionId}/exec`, "POST", { cmd: ["sleep", "5"], timeout_ms: 300 }), 200);
  await page.getByRole("navigation", { name: "Session views" }).getByRole("link", { name: "Events" }).click();
  const log = page.getByRole("table", { name: "Session events" });
  await log.locator("tr", { hasText: "session.created" }).getByText(/^bash on host \(jail, from (pool|cold)\)$/).waitFor();
  await log.locator("tr", { hasText: "exec.verdict" }).getByText(/^SANDBOX-EXEC-TIMEOUT · exec /).waitFor();
  await assertLabelled();
  await shot("events");
  // The view follows the log: the session's end comes in with its cause.
  assert.equal(await call(`/v1/sandbox/sessions/${sessionId}`, "DELETE"), 204);
  await log.locator("tr", { hasText: "session.stopped" }).getByRole("cell", { name: "deleted", exact: true }).waitFor();
  await page.locator(".summary .state", { hasText: "stopped" }).waitFor();
});

step("administer tenants with an admin key", async () => {
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByLabel("API key").fill(adminKey);
  await page.getByLabel("API key").press("Enter");
  await page.getByRole("heading", { name: "Tenants" }).waitFor();
  await page.getByRole("button", { name: "Edit tenant t1" }).waitFor();
  await page.getByLabel("Tenant id").fill("console-t3");
  await page.getByLabel("Max sessions").fill("3");
  await page.getByRole("button", { name: "Save tenant" }).click();
  await page.getByText("Saved tenant console-t3.").waitFor();
  await page.getByRole("button", { name: "Issue a key for console-t3" }).click();
  await page.getByText(/New key for console-t3 \(shown once\): \S+/).waitFor();
  await assertLabelled();
  await shot("admin");
});

step("no request left the daemon's origin, no policy violation, no key in a URL", () => {
  assert.deepEqual(foreign, []);
  assert.deepEqual(problems, []);
  assert.deepEqual(urls.filter((u) => u.includes(key) || u.includes(adminKey)), []);
});
