// Templates and snapshots: what each is, its size and layers, its upload state, and
// which sandboxes run from it now.

import { useFleet } from "../fleet";
import { bytes } from "../format";
import { usePolled } from "../polling";
import { BuildsView } from "./builds";
import { Alert } from "../alert";

interface Template {
  templateID: string;
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
  createdAt: string | null;
  buildCount: number;
  source?: string;
  layers?: string[];
}

interface Snapshot {
  snapshotID: string;
  names: string[];
  sandboxID: string;
  templateID: string;
  memory: boolean;
  sizeBytes: number;
  createdAt: string;
  status: string;
  uploadError?: string | null;
}

export function TemplatesPage() {
  const { sandboxes } = useFleet();
  const templates = usePolled<Template[]>("/templates", 5000);
  const snapshots = usePolled<Snapshot[]>("/snapshots?limit=100", 5000);
  const error = templates.error?.message ?? snapshots.error?.message;

  const using = (name: string) => [...sandboxes.values()].filter((s) => s.templateID === name || s.alias === name).length;
  return (
    <section>
      <header class="page-head">
        <h1>Templates</h1>
      </header>
      <Alert message={error} />
      <table class="grid" data-testid="templates">
        <thead>
          <tr>
            <th>Name</th>
            <th>Source</th>
            <th>Size</th>
            <th>Layers</th>
            <th>Builds</th>
            <th>Sandboxes</th>
          </tr>
        </thead>
        <tbody>
          {(templates.value ?? []).map((t) => (
            <tr data-template={t.templateID}>
              <td>{t.templateID}</td>
              <td>{t.source ?? ""}</td>
              <td>
                {t.cpuCount} vCPU, {t.memoryMB} MiB, {t.diskSizeMB} MiB disk
              </td>
              <td>{t.layers?.length ?? "—"}</td>
              <td>{t.buildCount}</td>
              <td>{using(t.templateID)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <h2>Snapshots</h2>
      <table class="grid" data-testid="snapshots">
        <thead>
          <tr>
            <th>Names</th>
            <th>From</th>
            <th>Memory</th>
            <th>Size</th>
            <th>Upload</th>
            <th>Sandboxes</th>
          </tr>
        </thead>
        <tbody>
          {(snapshots.value ?? []).map((s) => (
            <tr data-snapshot={s.snapshotID}>
              <td>{s.names.join(", ")}</td>
              <td>
                {s.sandboxID} ({s.templateID})
              </td>
              <td>{s.memory ? "with memory" : "disk only"}</td>
              <td>{bytes(s.sizeBytes)}</td>
              <td class={s.uploadError ? "error" : ""}>{s.uploadError ?? s.status}</td>
              <td>{s.names.reduce((n, name) => n + using(name), 0)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <BuildsView />
    </section>
  );
}
