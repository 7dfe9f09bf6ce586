import { json, Limits, Session, SessionMetrics, sessionPath } from "../api";
import { button, field, h, say, status, table, text, when } from "../dom";
import { Scope } from "../nav";

export function describeLimits(l: Limits): string {
  const parts = [];
  if (l.cpu_millis !== undefined) parts.push(`${l.cpu_millis} mCPU`);
  if (l.memory_mib !== undefined) parts.push(`${l.memory_mib} MiB`);
  if (l.disk_mib !== undefined) parts.push(`disk ${l.disk_mib} MiB`);
  if (l.pids !== undefined) parts.push(`${l.pids} pids`);
  return parts.join(" · ");
}

export function describeUsage(m: SessionMetrics | undefined): string {
  if (!m) return "—";
  return `cpu ${(m.cpu_used_ms / 1000).toFixed(1)} s · mem ${(m.memory_current_kib / 1024).toFixed(1)} MiB · disk ${(m.disk_used_kib / 1024).toFixed(1)} MiB`;
}

function createForm(region: HTMLElement, refresh: () => void): HTMLFormElement {
  const language = h("select", { name: "language" }, ...["bash", "python", "node"].map((l) => h("option", { value: l }, l)));
  const memory = h("input", { type: "number", name: "memory_mib", min: "16", value: "512" });
  const cpu = h("input", { type: "number", name: "cpu_millis", min: "100", value: "1000" });
  const timeout = h("input", { type: "number", name: "timeout_s", min: "10", value: "600" });
  const network = h("select", { name: "network" }, ...["none", "open"].map((m) => h("option", { value: m }, m)));
  const form = h(
    "form",
    { class: "inline", "aria-labelledby": "create-title" },
    h("h2", { id: "create-title" }, "Create a session"),
    field("Language", language),
    field("Memory (MiB)", memory),
    field("CPU (millicores)", cpu),
    field("Timeout (s)", timeout),
    field("Network", network),
    h("button", { type: "submit" }, "Create session"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    say(region, "Creating…");
    try {
      const s = await json<Session>("POST", "/v1/sandbox/sessions", {
        language: language.value,
        limits: { memory_mib: Number(memory.value), cpu_millis: Number(cpu.value) },
        timeout_s: Number(timeout.value),
        network: { mode: network.value },
      });
      say(region, `Created session ${s.id}.`);
      refresh();
    } catch (e) {
      say(region, String(e), true);
    }
  });
  return form;
}

export function sessions(root: HTMLElement, scope: Scope): void {
  const region = status();
  const list = h("div", { class: "list" });
  let generation = 0;
  const refresh = async () => {
    const mine = ++generation;
    try {
      const { sessions } = await json<{ sessions: Session[] }>("GET", "/v1/sandbox/sessions");
      const usage = await Promise.all(
        sessions.map((s) =>
          s.state === "running" ? json<SessionMetrics>("GET", `${sessionPath(s.id)}/metrics`).catch(() => undefined) : undefined,
        ),
      );
      if (mine !== generation) return;
      const rows = sessions.map((s, i) => [
        h("a", { href: `#/sessions/${encodeURIComponent(s.id)}` }, s.id),
        h("span", { class: `state ${s.state}` }, s.state),
        text(s.image ?? s.language),
        text(describeLimits(s.limits)),
        text(describeUsage(usage[i])),
        when(s.expires_at),
        button("Delete", async () => {
          try {
            await json("DELETE", sessionPath(s.id));
            say(region, `Deleted session ${s.id}.`);
            refresh();
          } catch (e) {
            say(region, String(e), true);
          }
        }, { "aria-label": `Delete session ${s.id}` }),
      ]);
      list.replaceChildren(
        sessions.length
          ? table(["Session", "State", "Image", "Limits", "Usage", "Expires", ""], rows, "Sessions (refreshed every 3 s)")
          : h("p", {}, "No sessions yet."),
      );
    } catch (e) {
      say(region, String(e), true);
    }
  };
  root.append(
    h("h1", { tabindex: "-1" }, "Sessions"),
    createForm(region, refresh),
    region,
    list,
  );
  scope.every(3000, refresh);
}
