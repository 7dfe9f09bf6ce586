import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import { apiKey, sessionPath } from "../api";
import { h, say, status } from "../dom";
import { Scope } from "../nav";
import { routeInlineStyles } from "../sheets";

routeInlineStyles(document);

/** Browsers cannot set headers on a WebSocket: the key rides as a subprotocol, never in the URL. */
function protocols(): string[] {
  const key = apiKey() ?? "";
  const b64 = btoa(String.fromCharCode(...new TextEncoder().encode(key)))
    .replace(/\+/g, "-")
    .replace(/\//g, "_")
    .replace(/=+$/, "");
  return ["koder.terminal.v1", `koder.bearer.${b64}`];
}

export function terminalPanel(root: HTMLElement, id: string, scope: Scope): void {
  const region = status();
  const box = h("div", { class: "terminal", "aria-label": "Terminal" });
  root.append(h("p", {}, "A shell in the session. Tab and arrow keys go to the terminal; press Escape then Tab to leave it."), box, region);
  const term = new Terminal({ cursorBlink: true, fontFamily: "monospace", fontSize: 14, convertEol: false });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(box);
  fit.fit();
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = `${scheme}//${location.host}${sessionPath(id)}/terminal?cols=${term.cols}&rows=${term.rows}`;
  const ws = new WebSocket(url, protocols());
  ws.binaryType = "arraybuffer";
  const encoder = new TextEncoder();
  ws.onopen = () => {
    say(region, "Connected.");
    term.focus();
  };
  ws.onmessage = (m) => {
    if (m.data instanceof ArrayBuffer) term.write(new Uint8Array(m.data));
    else say(region, String(m.data));
  };
  ws.onclose = (c) => say(region, `Disconnected${c.reason ? `: ${c.reason}` : ""}.`, c.code !== 1000);
  term.onData((d) => ws.readyState === WebSocket.OPEN && ws.send(encoder.encode(d)));
  term.onResize(({ cols, rows }) => ws.readyState === WebSocket.OPEN && ws.send(JSON.stringify({ type: "resize", cols, rows })));
  // Escape then Tab hands the focus back to the page (xterm keeps Tab for the shell).
  let escaped = false;
  term.attachCustomKeyEventHandler((e) => {
    if (e.type !== "keydown") return true;
    if (e.key === "Tab" && escaped) {
      escaped = false;
      term.blur();
      return false;
    }
    escaped = e.key === "Escape";
    return true;
  });
  const onResize = () => fit.fit();
  window.addEventListener("resize", onResize);
  scope.on(() => {
    window.removeEventListener("resize", onResize);
    ws.close(1000);
    term.dispose();
  });
}
