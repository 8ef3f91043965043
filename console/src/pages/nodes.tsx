// The nodes behind a control plane: capacity, what is committed, state; drain and
// activate. A single node has no such list, and says so.

import { useState } from "preact/hooks";

import { ApiError, send } from "../api";
import { bytes } from "../format";
import { usePolled } from "../polling";
import { Alert } from "../alert";

interface Capacity {
  memory_mb: number;
  committed_memory_mb: number;
  disk_mb: number;
  committed_disk_mb: number;
  cores: number;
  committed_vcpus: number;
  cpu_load: number;
  running: number;
  paused: number;
  cache_bytes: number;
  cache_limit_bytes: number;
}

interface NodeView {
  name: string;
  url: string;
  state: string;
  heartbeatAgeSeconds: number;
  capacity: Capacity;
}

function share(used: number, total: number): string {
  return total ? `${used} / ${total} (${Math.round((100 * used) / total)}%)` : `${used}`;
}

export function NodesPage() {
  const [generation, setGeneration] = useState(0);
  const [failed, setFailed] = useState<string | null>(null);
  const polled = usePolled<NodeView[]>("/nodes", 3000, generation);
  const single = polled.error instanceof ApiError && polled.error.status === 404;
  const error = failed ?? (single ? null : polled.error?.message ?? null);
  const nodes = polled.value;

  async function fire(name: string, action: "drain" | "activate") {
    try {
      await send("POST", `/nodes/${encodeURIComponent(name)}/${action}`);
      setFailed(null);
    } catch (e) {
      setFailed((e as Error).message);
    }
    setGeneration((g) => g + 1);
  }

  if (single) return <p class="muted">This server is a single node: it has no nodes behind it.</p>;
  return (
    <section>
      <header class="page-head">
        <h1>Nodes</h1>
      </header>
      <Alert message={error} />
      <table class="grid" data-testid="nodes">
        <thead>
          <tr>
            <th>Name</th>
            <th>State</th>
            <th>Heard from</th>
            <th>Memory committed (MiB)</th>
            <th>Disk committed (MiB)</th>
            <th>vCPUs committed</th>
            <th>Load</th>
            <th>Chunk cache</th>
            <th>Running</th>
            <th>Paused</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {(nodes ?? []).map((n) => (
            <tr data-node={n.name}>
              <td>{n.name}</td>
              <td class={`node-state ${n.state}`}>{n.state}</td>
              <td>{n.heartbeatAgeSeconds}s ago</td>
              <td>{share(n.capacity.committed_memory_mb, n.capacity.memory_mb)}</td>
              <td>{share(n.capacity.committed_disk_mb, n.capacity.disk_mb)}</td>
              <td>{share(n.capacity.committed_vcpus, n.capacity.cores)}</td>
              <td>{n.capacity.cpu_load.toFixed(2)}</td>
              <td>
                {bytes(n.capacity.cache_bytes ?? 0)} / {bytes(n.capacity.cache_limit_bytes ?? 0)}
              </td>
              <td>{n.capacity.running}</td>
              <td>{n.capacity.paused}</td>
              <td>
                {n.state === "active" ? (
                  <button onClick={() => fire(n.name, "drain")}>Drain</button>
                ) : n.state === "draining" ? (
                  <button onClick={() => fire(n.name, "activate")}>Activate</button>
                ) : null}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}
