// The server's API as the console calls it: the key rides in a header, never in a URL.

const KEY = "aenv.apiKey";
const signOutListeners = new Set<() => void>();

export function apiKey(): string | null {
  return sessionStorage.getItem(KEY);
}

export function signIn(key: string): void {
  sessionStorage.setItem(KEY, key);
}

export function signOut(): void {
  sessionStorage.removeItem(KEY);
  signOutListeners.forEach((listener) => listener());
}

export function onSignOut(listener: () => void): () => void {
  signOutListeners.add(listener);
  return () => signOutListeners.delete(listener);
}

/** An answer other than 2xx, with the server's `{code, message}`. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

async function failure(response: Response): Promise<ApiError> {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && typeof body.message === "string") message = body.message;
  } catch {
    // Not JSON: the status line says it.
  }
  return new ApiError(response.status, message);
}

/** A call to the API with the session's key; a 401 signs the console out. */
export async function call(path: string, init: RequestInit = {}, key = apiKey()): Promise<Response> {
  const headers = new Headers(init.headers);
  if (key) headers.set("X-API-Key", key);
  const response = await fetch(path, { ...init, headers, cache: "no-store" });
  if (response.status === 401) {
    if (key === apiKey()) signOut();
    throw await failure(response);
  }
  if (!response.ok) throw await failure(response);
  return response;
}

export async function getJson<T>(path: string): Promise<T> {
  return (await call(path)).json() as Promise<T>;
}

export async function send<T = unknown>(method: string, path: string, body?: unknown): Promise<T | null> {
  const init: RequestInit = { method };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { "Content-Type": "application/json" };
  }
  const response = await call(path, init);
  const text = await response.text();
  return text ? (JSON.parse(text) as T) : null;
}

/** Whether `key` opens the API (the sign-in check). */
export async function keyWorks(key: string): Promise<boolean> {
  try {
    await call("/v2/sandboxes?limit=1", {}, key);
    return true;
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) return false;
    throw error;
  }
}

export interface Sandbox {
  sandboxID: string;
  templateID: string;
  alias?: string | null;
  startedAt: string;
  endAt: string;
  cpuCount: number;
  memoryMB: number;
  metadata: Record<string, string>;
  state: "running" | "paused";
  node?: string | null;
  hostMemoryMB?: number | null;
}

export interface SandboxDetail extends Sandbox {
  envdAccessToken?: string | null;
  allowInternetAccess?: boolean | null;
  network?: Record<string, unknown> | null;
  storage?: "uploading" | "stored" | null;
  pauseMode?: string | null;
}

export interface Metric {
  timestampUnix: number;
  cpuUsedPct: number;
  memUsed: number;
  memTotal: number;
}

export interface LogEntry {
  timestamp: string;
  level: string;
  message: string;
}
