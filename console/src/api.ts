// The console's one door to the daemon: every call carries the key in the Authorization header
// (never in a URL), and every non-2xx answer becomes an ApiError with the SANDBOX code.

const KEY = "koder.console.key";

export function apiKey(): string | null {
  return sessionStorage.getItem(KEY);
}

export function setApiKey(key: string | null): void {
  if (key === null) sessionStorage.removeItem(KEY);
  else sessionStorage.setItem(KEY, key);
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(`${code}: ${message}`);
  }
}

function headers(extra: Record<string, string> = {}): Headers {
  const h = new Headers(extra);
  const key = apiKey();
  if (key) h.set("Authorization", `Bearer ${key}`);
  return h;
}

async function failure(res: Response): Promise<ApiError> {
  try {
    const body = await res.json();
    return new ApiError(res.status, body?.error?.code ?? "SANDBOX-UNKNOWN", body?.error?.message ?? res.statusText);
  } catch {
    return new ApiError(res.status, "SANDBOX-UNKNOWN", res.statusText);
  }
}

/** A request whose answer the caller reads itself (streams, downloads). */
export async function raw(method: string, path: string, init: RequestInit & { accept?: string } = {}): Promise<Response> {
  const extra: Record<string, string> = {};
  if (init.accept) extra["Accept"] = init.accept;
  if (init.body && typeof init.body === "string") extra["Content-Type"] = "application/json";
  const res = await fetch(path, { ...init, method, headers: headers(extra), credentials: "omit", cache: "no-store" });
  if (!res.ok) throw await failure(res);
  return res;
}

export async function json<T>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await raw(method, path, body === undefined ? {} : { body: JSON.stringify(body) });
  if (res.status === 204) return undefined as T;
  return (await res.json()) as T;
}

/** Query strings built from parts, each encoded. */
export function q(path: string, params: Record<string, string | number | undefined>): string {
  const s = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined) s.set(k, String(v));
  const t = s.toString();
  return t ? `${path}?${t}` : path;
}

export const sessionPath = (id: string) => `/v1/sandbox/sessions/${encodeURIComponent(id)}`;

export interface Limits {
  cpu_millis?: number;
  memory_mib?: number;
  disk_mib?: number;
  pids?: number;
}

export interface Session {
  id: string;
  tenant_id: string;
  language: string;
  image?: string;
  state: string;
  created_at: string;
  expires_at: string;
  limits: Limits;
  network?: { mode: string; allow?: string[] };
  metadata?: Record<string, string>;
}

export interface SessionMetrics {
  cpu_used_ms: number;
  memory_current_kib: number;
  memory_peak_kib: number;
  memory_limit_kib: number | null;
  oom_kills: number;
  pids_current: number;
  pids_limit: number | null;
  disk_used_kib: number;
  disk_total_kib: number;
}

export interface SessionEvent {
  seq: number;
  id: string;
  type: string;
  created_at: string;
  data: Record<string, unknown> | null;
}

export interface FileEntry {
  name: string;
  path: string;
  type: "file" | "dir" | "symlink";
  size: number;
  mode: number;
  modified_at?: string;
}

export interface AuditEntry {
  at: string;
  session_id: string;
  dest: string;
  name?: string;
  port: number;
  proto: string;
  allowed: boolean;
  reason?: string;
}

export interface Tenant {
  id: string;
  name: string;
  plan: string;
  max_sessions: number | null;
  daily_session_minutes: number | null;
  created_at: string;
  live_sessions: number;
  session_minutes_today: number;
}
