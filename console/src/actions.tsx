// What an operator may do to a sandbox; killing asks first.

import { useState } from "preact/hooks";

import { send, type Sandbox } from "./api";
import { Alert } from "./alert";

export function SandboxActions({ sandbox, compact = false }: { sandbox: Sandbox; compact?: boolean }) {
  const [busy, setBusy] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const path = `/sandboxes/${sandbox.sandboxID}`;

  async function act(name: string, run: () => Promise<unknown>) {
    setBusy(name);
    setError(null);
    try {
      await run();
    } catch (failure) {
      setError((failure as Error).message);
    } finally {
      setBusy(null);
    }
  }

  const running = sandbox.state === "running";
  return (
    <span class={compact ? "actions compact" : "actions"}>
      {running ? (
        <button disabled={busy !== null} onClick={() => act("pause", () => send("POST", `${path}/pause`))}>
          {busy === "pause" ? "Pausing…" : "Pause"}
        </button>
      ) : (
        <button disabled={busy !== null} onClick={() => act("resume", () => send("POST", `/v2${path}/connect`, {}))}>
          {busy === "resume" ? "Resuming…" : "Resume"}
        </button>
      )}
      {!compact && running && (
        <button disabled={busy !== null} onClick={() => act("snapshot", () => send("POST", `${path}/snapshots`, {}))}>
          {busy === "snapshot" ? "Snapshotting…" : "Snapshot"}
        </button>
      )}
      {!compact && running && (
        <button disabled={busy !== null} onClick={() => act("fork", () => send("POST", `${path}/fork`, { count: 1 }))}>
          {busy === "fork" ? "Forking…" : "Fork"}
        </button>
      )}
      <button
        class="danger"
        disabled={busy !== null}
        onClick={() => confirm(`Kill sandbox ${sandbox.sandboxID}? Its state is gone for good.`) && act("kill", () => send("DELETE", path))}
      >
        {busy === "kill" ? "Killing…" : "Kill"}
      </button>
      <Alert message={error} inline />
    </span>
  );
}
