// Template builds this server (or, behind a control plane, the node builds go to) keeps:
// each one's status, and its log followed while it builds.

import { useEffect, useState } from "preact/hooks";

import { getJson } from "../api";
import { usePolled } from "../polling";

interface BuildSummary {
  templateID: string;
  buildID: string;
  status: string;
  createdAt: string;
  finishedAt: string | null;
  reason: string | null;
}

interface BuildStatus {
  status: string;
  logEntries: { timestamp: string; level: string; message: string }[];
}

// How often a build's log is asked for while it runs.
const FOLLOW_MS = 1000;

function BuildLog({ build }: { build: BuildSummary }) {
  const [lines, setLines] = useState<string[]>([]);
  const [status, setStatus] = useState(build.status);

  useEffect(() => {
    let offset = 0;
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const path = `/templates/${encodeURIComponent(build.templateID)}/builds/${build.buildID}/status`;
    const next = async () => {
      try {
        const page = await getJson<BuildStatus>(`${path}?logsOffset=${offset}&limit=100`);
        if (stopped) return;
        offset += page.logEntries.length;
        setLines((before) => [...before, ...page.logEntries.map((e) => `${e.timestamp} ${e.level.padEnd(5)} ${e.message}`)]);
        setStatus(page.status);
        const more = page.logEntries.length === 100;
        if (more || !["ready", "error"].includes(page.status)) timer = setTimeout(next, more ? 0 : FOLLOW_MS);
      } catch (e) {
        if (!stopped) setLines((before) => [...before, `(log unavailable: ${(e as Error).message})`]);
      }
    };
    void next();
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }, [build.buildID]);

  return (
    <section class="panel">
      <header>
        Build {build.buildID} of {build.templateID}: <span data-testid="build-status">{status}</span>
      </header>
      <pre class="logs" data-testid="build-log">
        {lines.join("\n")}
      </pre>
    </section>
  );
}

export function BuildsView() {
  const builds = usePolled<BuildSummary[]>("/console/api/builds", 3000).value ?? [];
  const [open, setOpen] = useState<BuildSummary | null>(null);
  return (
    <>
      <h2>Builds</h2>
      {builds.length === 0 && <p class="muted">No build since the server started.</p>}
      <table class="grid" data-testid="builds">
        <tbody>
          {builds.map((b) => (
            <tr data-build={b.buildID}>
              <td>{b.templateID}</td>
              <td class={b.status === "error" ? "error" : ""}>{b.status}</td>
              <td>{b.createdAt}</td>
              <td>{b.reason ?? ""}</td>
              <td>
                <button class="link" onClick={() => setOpen(b)}>
                  Log
                </button>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {open && <BuildLog key={open.buildID} build={open} />}
    </>
  );
}
