import { apiKey, setApiKey } from "./api";
import { h } from "./dom";
import { go, role, Scope, setRole } from "./nav";
import { admin } from "./pages/admin";
import { auditPanel } from "./pages/audit";
import { isTab, session } from "./pages/session";
import { sessions } from "./pages/sessions";
import { signIn } from "./pages/signin";

const main = document.getElementById("main") as HTMLElement;
const nav = document.getElementById("nav") as HTMLElement;
let scope = new Scope();

function link(href: string, label: string, current: boolean): HTMLElement {
  return h("li", {}, h("a", { href, "aria-current": current ? "page" : undefined }, label));
}

function drawNav(hash: string): void {
  const r = role();
  const items: HTMLElement[] = [];
  if (r === "tenant") {
    items.push(link("#/sessions", "Sessions", hash.startsWith("#/sessions")), link("#/audit", "Network audit", hash === "#/audit"));
  }
  if (r === "admin") items.push(link("#/admin", "Tenants", hash === "#/admin"));
  if (r) {
    const out = h("button", { type: "button" }, "Sign out");
    out.addEventListener("click", () => {
      setApiKey(null);
      setRole(null);
      go("#/signin");
    });
    items.push(h("li", {}, out));
  }
  nav.replaceChildren(h("ul", {}, ...items));
}

function route(): void {
  scope.close();
  scope = new Scope();
  main.replaceChildren();
  const hash = location.hash || "#/";
  const parts = hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const r = apiKey() ? role() : null;
  if (!r && parts[0] !== "signin") return go("#/signin");
  drawNav(hash);
  if (parts[0] === "signin") signIn(main);
  else if (parts[0] === "sessions" && parts[1] && r === "tenant") session(main, parts[1], isTab(parts[2]) ? parts[2] : "exec", scope);
  else if (parts[0] === "sessions" && r === "tenant") sessions(main, scope);
  else if (parts[0] === "audit" && r === "tenant") {
    main.append(h("h1", { tabindex: "-1" }, "Network audit"));
    auditPanel(main);
  } else if (parts[0] === "admin" && r === "admin") admin(main);
  else return go(r === "admin" ? "#/admin" : "#/sessions");
  // A new page announces itself: the focus moves to its heading.
  main.querySelector<HTMLElement>("h1")?.focus({ preventScroll: true });
  document.title = `${main.querySelector("h1")?.textContent ?? "Console"} · koder-sandbox`;
}

// The skip link moves the focus without touching the hash (the hash is the route).
document.querySelector(".skip")?.addEventListener("click", (ev) => {
  ev.preventDefault();
  main.focus();
});
window.addEventListener("hashchange", route);
window.addEventListener("koder-role", () => drawNav(location.hash));
route();
