// A sandbox's agent (E2B's envd) through the server's data plane, by the same Connect
// protocol and headers the SDKs use. The API key is never sent here: the guest is not
// trusted with it; its own access token is what it checks.

const ENVD_PORT = "49983";
const STREAM = "application/connect+json";

export interface Envelope {
  end: boolean;
  message: Record<string, unknown>;
}

/** Connect's stream frames: a flags byte, a big-endian length, then JSON. */
export class EnvelopeReader {
  private pending = new Uint8Array(0);
  private decoder = new TextDecoder();

  feed(chunk: Uint8Array): Envelope[] {
    const joined = new Uint8Array(this.pending.length + chunk.length);
    joined.set(this.pending);
    joined.set(chunk, this.pending.length);
    const found: Envelope[] = [];
    let at = 0;
    while (joined.length - at >= 5) {
      const length = new DataView(joined.buffer, joined.byteOffset + at + 1, 4).getUint32(0);
      if (joined.length - at - 5 < length) break;
      const body = joined.subarray(at + 5, at + 5 + length);
      found.push({ end: (joined[at] & 2) !== 0, message: JSON.parse(this.decoder.decode(body) || "{}") });
      at += 5 + length;
    }
    this.pending = joined.slice(at);
    return found;
  }
}

export function envelope(message: unknown): Uint8Array<ArrayBuffer> {
  const body = new TextEncoder().encode(JSON.stringify(message));
  const framed = new Uint8Array(new ArrayBuffer(5 + body.length));
  new DataView(framed.buffer).setUint32(1, body.length);
  framed.set(body, 5);
  return framed;
}

export function toBase64(bytes: Uint8Array): string {
  let text = "";
  for (const byte of bytes) text += String.fromCharCode(byte);
  return btoa(text);
}

export function fromBase64(text: string): Uint8Array {
  return Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
}

export class EnvdError extends Error {}

export interface DirEntry {
  name: string;
  path: string;
  type: string;
  size?: string | number;
}

export class Envd {
  constructor(
    readonly sandboxId: string,
    private readonly accessToken: string | null | undefined,
    readonly user = "user",
  ) {}

  headers(extra: Record<string, string> = {}): Headers {
    const headers = new Headers({
      "E2b-Sandbox-Id": this.sandboxId,
      "E2b-Sandbox-Port": ENVD_PORT,
      Authorization: "Basic " + btoa(`${this.user}:`),
      ...extra,
    });
    if (this.accessToken) headers.set("X-Access-Token", this.accessToken);
    return headers;
  }

  async unary<T>(method: string, request: unknown): Promise<T> {
    const response = await fetch(`/${method}`, {
      method: "POST",
      headers: this.headers({ "Content-Type": "application/json", "Connect-Protocol-Version": "1" }),
      body: JSON.stringify(request),
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) throw new EnvdError(body.message || `${method}: ${response.status}`);
    return body as T;
  }

  /** A server stream's messages, in order, until it ends or `signal` aborts. */
  async *stream(method: string, request: unknown, signal: AbortSignal): AsyncGenerator<Record<string, unknown>> {
    const response = await fetch(`/${method}`, {
      method: "POST",
      headers: this.headers({ "Content-Type": STREAM, "Connect-Protocol-Version": "1" }),
      body: envelope(request),
      signal,
    });
    if (!response.ok || !response.body) {
      const body = await response.json().catch(() => ({}));
      throw new EnvdError(body.message || `${method}: ${response.status}`);
    }
    const reader = response.body.getReader();
    const frames = new EnvelopeReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      for (const frame of frames.feed(value)) {
        if (frame.end) {
          const error = frame.message.error as { message?: string } | undefined;
          if (error) throw new EnvdError(error.message || "stream failed");
          return;
        }
        yield frame.message;
      }
    }
  }

  async listDir(path: string): Promise<DirEntry[]> {
    const answer = await this.unary<{ entries?: DirEntry[] }>("filesystem.Filesystem/ListDir", { path, depth: 1 });
    return answer.entries ?? [];
  }

  async download(path: string): Promise<Blob> {
    const response = await fetch(`/files?path=${encodeURIComponent(path)}&username=${this.user}`, {
      headers: this.headers(),
    });
    if (!response.ok) throw new EnvdError(`download ${path}: ${response.status}`);
    return response.blob();
  }

  async upload(path: string, file: Blob): Promise<void> {
    const form = new FormData();
    form.append("file", file, path.split("/").pop() || "file");
    const response = await fetch(`/files?path=${encodeURIComponent(path)}&username=${this.user}`, {
      method: "POST",
      headers: this.headers(),
      body: form,
    });
    if (!response.ok) throw new EnvdError(`upload ${path}: ${response.status}`);
  }
}
