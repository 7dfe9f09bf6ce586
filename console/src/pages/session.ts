import { json, Session, sessionPath } from "../api";
import { h, say, status } from "../dom";
import { describeLimits } from "./sessions";
import { Scope } from "../nav";
import { auditPanel } from "./audit";
import { eventsPanel } from "./events";
import { execPanel } from "./exec";
import { filesPanel } from "./files";
import { metricsPanel } from "./metrics";
import { terminalPanel } from "./terminal";

const TABS = {
  exec: { label: "Exec", open: execPanel },
  terminal: { label: "Terminal", open: terminalPanel },
  files: { label: "Files", open: (root: HTMLElement, id: string) => filesPanel(root, id) },
  metrics: { label: "Metrics", open: metricsPanel },
  audit: { label: "Network audit", open: (root: HTMLElement, id: string) => auditPanel(root, id) },
  events: { label: "Events", open: eventsPanel },
} as const;

export type Tab = keyof typeof TABS;

export function isTab(t: string | undefined): t is Tab {
  return t !== undefined && t in TABS;
}

/** One session: a summary and tabs (links, so each tab has an address and the keyboard works). */
export function session(root: HTMLElement, id: string, tab: Tab, scope: Scope): void {
  const summary = h("p", { class: "summary" });
  const region = status();
  const path = `#/sessions/${encodeURIComponent(id)}`;
  const tabs = h(
    "nav",
    { class: "tabs", "aria-label": "Session views" },
    ...Object.entries(TABS).map(([key, t]) =>
      h("a", { href: `${path}/${key}`, "aria-current": key === tab ? "page" : undefined }, t.label),
    ),
  );
  const panel = h("section", { class: "panel", "aria-label": TABS[tab].label });
  root.append(h("h1", { tabindex: "-1" }, `Session ${id}`), summary, region, tabs, panel);
  scope.every(3000, async () => {
    try {
      const s = await json<Session>("GET", sessionPath(id));
      summary.replaceChildren(
        h("span", { class: `state ${s.state}` }, s.state),
        ` ${s.image ?? s.language} · ${describeLimits(s.limits)} · network ${s.network?.mode ?? "none"} · expires ${new Date(s.expires_at).toLocaleString()}`,
      );
    } catch (e) {
      say(region, String(e), true);
    }
  });
  TABS[tab].open(panel, id, scope);
}
