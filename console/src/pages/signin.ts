import { ApiError, json, setApiKey } from "../api";
import { field, h, say, status } from "../dom";
import { go, setRole } from "../nav";

/** Finds what the key opens: a tenant's sessions, or (an operator key) the tenant admin pages. */
async function roleOf(): Promise<"tenant" | "admin"> {
  try {
    await json("GET", "/v1/sandbox/sessions");
    return "tenant";
  } catch (e) {
    if (!(e instanceof ApiError) || e.status !== 401) throw e;
    await json("GET", "/v1/sandbox/admin/tenants");
    return "admin";
  }
}

export function signIn(root: HTMLElement): void {
  const key = h("input", { type: "password", name: "api-key", autocomplete: "off", required: true, spellcheck: "false" });
  const region = status();
  const form = h(
    "form",
    { "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title", tabindex: "-1" }, "Sign in"),
    h("p", {}, "An API key of a tenant, or an operator's admin key. It is kept in this tab only (session storage)."),
    field("API key", key),
    h("button", { type: "submit" }, "Sign in"),
    region,
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    setApiKey(key.value.trim());
    try {
      const role = await roleOf();
      setRole(role);
      go(role === "admin" ? "#/admin" : "#/sessions");
    } catch (e) {
      setApiKey(null);
      say(region, e instanceof ApiError && e.status === 401 ? "This key is not valid." : String(e), true);
    }
  });
  root.append(form);
}
