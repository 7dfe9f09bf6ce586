import { AuditEntry, json, q } from "../api";
import { button, field, h, say, status, table, text, when } from "../dom";

/** The network audit log: every connection and lookup a sandbox attempted, with the decision. */
export function auditPanel(root: HTMLElement, sessionId?: string): void {
  const region = status();
  const list = h("div", { class: "list" });
  const allowed = h("select", { name: "allowed" }, h("option", { value: "" }, "all"), h("option", { value: "true" }, "allowed"), h("option", { value: "false" }, "refused"));
  const load = async () => {
    try {
      const { entries } = await json<{ entries: AuditEntry[] }>(
        "GET",
        q("/v1/sandbox/audit/network", { session_id: sessionId, allowed: allowed.value || undefined, limit: 200 }),
      );
      const rows = entries.map((e) => [
        when(e.at),
        ...(sessionId ? [] : [h("a", { href: `#/sessions/${encodeURIComponent(e.session_id)}` }, e.session_id)]),
        text(e.proto),
        text(`${e.dest}:${e.port}`),
        text(e.name ?? null),
        h("span", { class: e.allowed ? "allowed" : "refused" }, e.allowed ? "allowed" : "refused"),
        text(e.reason ?? null),
      ]);
      const headings = ["At", ...(sessionId ? [] : ["Session"]), "Protocol", "Destination", "Name", "Decision", "Reason"];
      list.replaceChildren(entries.length ? table(headings, rows, "Network audit log") : h("p", {}, "No network attempts recorded."));
      say(region, `${entries.length} entries.`);
    } catch (e) {
      say(region, String(e), true);
    }
  };
  allowed.addEventListener("change", load);
  root.append(h("div", { class: "inline" }, field("Decision", allowed), button("Refresh", load)), region, list);
  void load();
}
