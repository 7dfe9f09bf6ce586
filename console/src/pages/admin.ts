import { json, Tenant } from "../api";
import { button, field, h, say, status, table, text, when } from "../dom";

function optionalNumber(v: string): number | undefined {
  return v.trim() === "" ? undefined : Number(v);
}

/** Tenant administration with an operator key: plans, quotas, keys. */
export function admin(root: HTMLElement): void {
  const region = status();
  const list = h("div", { class: "list" });
  const issued = h("output", { class: "issued", "aria-live": "polite" });
  const id = h("input", { type: "text", name: "tenant", required: true, spellcheck: "false" });
  const name = h("input", { type: "text", name: "name" });
  const plan = h("input", { type: "text", name: "plan", value: "free", required: true });
  const maxSessions = h("input", { type: "number", name: "max_sessions", min: "0" });
  const minutes = h("input", { type: "number", name: "daily_session_minutes", min: "0" });

  const issue = async (tenant: string) => {
    try {
      const k = await json<{ tenant_id: string; api_key: string }>("POST", `/v1/sandbox/admin/tenants/${encodeURIComponent(tenant)}/keys`);
      issued.textContent = `New key for ${k.tenant_id} (shown once): ${k.api_key}`;
    } catch (e) {
      say(region, String(e), true);
    }
  };
  const load = async () => {
    try {
      const { tenants } = await json<{ tenants: Tenant[] }>("GET", "/v1/sandbox/admin/tenants");
      const rows = tenants.map((t) => [
        button(t.id, () => {
          id.value = t.id;
          name.value = t.name;
          plan.value = t.plan;
          maxSessions.value = t.max_sessions === null ? "" : String(t.max_sessions);
          minutes.value = t.daily_session_minutes === null ? "" : String(t.daily_session_minutes);
          id.focus();
        }, { class: "link", "aria-label": `Edit tenant ${t.id}` }),
        text(t.name),
        text(t.plan),
        text(t.max_sessions),
        text(t.daily_session_minutes),
        text(t.live_sessions),
        text(t.session_minutes_today),
        when(t.created_at),
        button("Issue key", () => issue(t.id), { "aria-label": `Issue a key for ${t.id}` }),
      ]);
      list.replaceChildren(
        table(["Tenant", "Name", "Plan", "Max sessions", "Daily minutes", "Live", "Minutes today", "Created", ""], rows, "Tenants"),
      );
    } catch (e) {
      say(region, String(e), true);
    }
  };
  const form = h(
    "form",
    { class: "inline", "aria-labelledby": "tenant-form" },
    h("h2", { id: "tenant-form" }, "Create or update a tenant"),
    field("Tenant id", id),
    field("Name", name),
    field("Plan", plan),
    field("Max sessions", maxSessions),
    field("Daily session minutes", minutes),
    h("button", { type: "submit" }, "Save tenant"),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      await json("PUT", `/v1/sandbox/admin/tenants/${encodeURIComponent(id.value)}`, {
        name: name.value || undefined,
        plan: plan.value,
        max_sessions: optionalNumber(maxSessions.value),
        daily_session_minutes: optionalNumber(minutes.value),
      });
      say(region, `Saved tenant ${id.value}.`);
      await load();
    } catch (e) {
      say(region, String(e), true);
    }
  });
  root.append(h("h1", { tabindex: "-1" }, "Tenants"), form, region, issued, list);
  void load();
}
