import { raw, sessionPath } from "../api";
import { AnsiWriter } from "../ansi";
import { field, h, say, status } from "../dom";
import { Scope } from "../nav";
import { events } from "../sse";

interface ExitEvent {
  exit_code: number | null;
  signal: string | null;
  duration_ms: number;
  verdict: string | null;
  peak_memory_kib?: number;
}

function decode(payload: { data?: string; data_b64?: string }, decoder: TextDecoder): string {
  if (payload.data !== undefined) return payload.data;
  if (payload.data_b64 === undefined) return "";
  const bytes = Uint8Array.from(atob(payload.data_b64), (c) => c.charCodeAt(0));
  return decoder.decode(bytes, { stream: true });
}

function outcome(e: ExitEvent): string {
  const parts = [e.exit_code !== null ? `exit code ${e.exit_code}` : `signal ${e.signal ?? "?"}`, `${e.duration_ms} ms`];
  if (e.verdict) parts.push(e.verdict);
  return parts.join(" · ");
}

/** A streamed exec: output shows as it is printed, then the exit code and duration. */
export function execPanel(root: HTMLElement, id: string, scope: Scope): void {
  const command = h("input", { type: "text", name: "command", class: "wide", spellcheck: "false", value: "" });
  const output = h("pre", { class: "output", role: "log", "aria-label": "Command output", tabindex: "0" });
  const result = h("p", { class: "result", "aria-live": "polite" });
  const region = status();
  const run = h("button", { type: "submit" }, "Run");
  const form = h("form", { class: "inline", "aria-label": "Run a command" }, field("Command (bash)", command), run);
  let abort: AbortController | null = null;
  scope.on(() => abort?.abort());
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    abort?.abort();
    abort = new AbortController();
    output.replaceChildren();
    result.textContent = "running…";
    say(region, "");
    const out = new AnsiWriter(output);
    const err = new AnsiWriter(output, "stderr");
    const decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    try {
      const res = await raw("POST", `${sessionPath(id)}/exec`, {
        body: JSON.stringify({ shell: command.value }),
        accept: "text/event-stream",
        signal: abort.signal,
      });
      if (!res.body) throw new Error("no response body");
      for await (const e of events(res.body)) {
        const payload = JSON.parse(e.data);
        if (e.event === "stdout") out.write(decode(payload, decoders.stdout));
        else if (e.event === "stderr") err.write(decode(payload, decoders.stderr));
        else if (e.event === "exit") result.textContent = outcome(payload as ExitEvent);
      }
    } catch (e) {
      if ((e as Error).name !== "AbortError") {
        result.textContent = "";
        say(region, String(e), true);
      }
    }
  });
  root.append(form, output, result, region);
  command.focus();
}
