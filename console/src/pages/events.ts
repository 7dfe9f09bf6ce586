import { json, q, SessionEvent, sessionPath } from "../api";
import { h, say, status, table, text, when } from "../dom";
import { Scope } from "../nav";

/** One line of what an event says; its data is the daemon's, shown as text only. */
function describe(e: SessionEvent): string {
  const d = e.data ?? {};
  const or = (v: unknown) => (v === null || v === undefined ? "—" : String(v));
  switch (e.type) {
    case "session.created":
      return `${or(d.language)} on ${or(d.image)} (${or(d.runtime)}, from ${or(d.source)})`;
    case "session.paused":
      return d.memory ? "in memory" : "to disk";
    case "session.resumed":
      return "";
    case "session.stopped":
      // The recorded reason often is the cause itself ("deleted").
      return d.reason === undefined || d.reason === d.cause ? or(d.cause) : `${or(d.cause)}: ${or(d.reason)}`;
    case "exec.verdict":
      return `${or(d.verdict)} · exec ${or(d.exec_id)} · exit ${or(d.exit_code)} · signal ${or(d.signal)} · ${or(d.duration_ms)} ms`;
    default:
      return JSON.stringify(d);
  }
}

/**
 * What happened to the session, oldest first: its creation, pauses, resumes, its end and why,
 * and execs killed by a limit. Followed while the tab is open (only events after the last one
 * shown are asked for); a stopped session's log stays readable.
 */
export function eventsPanel(root: HTMLElement, id: string, scope: Scope): void {
  const region = status();
  const list = h("div", { class: "list" });
  const seen: SessionEvent[] = [];
  let asking = false;
  root.append(h("p", {}, "What happened to the session, oldest first, followed while this view is open."), region, list);
  const render = () => {
    const rows = seen.map((e) => [text(e.seq), when(e.created_at), text(e.type), text(describe(e) || null)]);
    list.replaceChildren(seen.length ? table(["#", "At", "Event", "Details"], rows, "Session events") : h("p", {}, "No events recorded."));
    say(region, `${seen.length} events.`);
  };
  scope.every(3000, async () => {
    // A slow answer must not overlap the next tick: both would append the same events.
    if (asking) return;
    asking = true;
    try {
      let more = true;
      while (more) {
        const after = seen.length ? seen[seen.length - 1].seq : 0;
        const page = await json<{ events: SessionEvent[]; more: boolean }>("GET", q(`${sessionPath(id)}/events`, { after, limit: 500 }));
        seen.push(...page.events);
        more = page.more && page.events.length > 0;
      }
      render();
    } catch (e) {
      say(region, String(e), true);
    } finally {
      asking = false;
    }
  });
}
