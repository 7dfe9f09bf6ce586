const ROLE = "koder.console.role";

export type Role = "tenant" | "admin";

export function role(): Role | null {
  const r = sessionStorage.getItem(ROLE);
  return r === "tenant" || r === "admin" ? r : null;
}

export function setRole(r: Role | null): void {
  if (r === null) sessionStorage.removeItem(ROLE);
  else sessionStorage.setItem(ROLE, r);
  window.dispatchEvent(new Event("koder-role"));
}

export function go(hash: string): void {
  if (location.hash === hash) window.dispatchEvent(new HashChangeEvent("hashchange"));
  else location.hash = hash;
}

/** Work a page started (timers, sockets) that must stop when the page goes. */
export type Cleanup = () => void;

export class Scope {
  private readonly cleanups: Cleanup[] = [];
  on(c: Cleanup): void {
    this.cleanups.push(c);
  }
  every(ms: number, f: () => void): void {
    f();
    const t = window.setInterval(f, ms);
    this.on(() => window.clearInterval(t));
  }
  close(): void {
    for (const c of this.cleanups.splice(0)) c();
  }
}
