// Every sandbox, kept current by one event stream; filtered in the page and drawn a
// window of rows at a time, so ten thousand rows cost what forty do.

import { useEffect, useMemo, useState } from "preact/hooks";

import type { Metric, Sandbox } from "../api";
import { SandboxActions } from "../actions";
import { age, timeLeft } from "../format";
import { useFleet } from "../fleet";
import { usePolled } from "../polling";

const ROW_HEIGHT = 32;
// How often the drawn rows' CPU and memory are asked for, in one request for them all.
const USAGE_MS = 5000;
// E2B's bound on one request for many sandboxes' metrics.
const USAGE_BATCH = 100;
const OVERSCAN = 10;

/** The latest CPU and memory of `ids` (running sandboxes drawn now), one request a tick. */
function useUsage(ids: string[]): Map<string, Metric> {
  const key = ids.slice(0, USAGE_BATCH).join(",");
  const path = key ? `/sandboxes/metrics?sandbox_ids=${encodeURIComponent(key)}` : null;
  const found = usePolled<{ sandboxes: Record<string, Metric> }>(path, USAGE_MS).value;
  return useMemo(() => new Map(Object.entries(found?.sandboxes ?? {})), [found]);
}

interface Filter {
  state: string;
  template: string;
  metadata: string;
}

function matches(sandbox: Sandbox, filter: Filter): boolean {
  if (filter.state && sandbox.state !== filter.state) return false;
  if (filter.template && ![sandbox.templateID, sandbox.alias].includes(filter.template)) return false;
  for (const pair of filter.metadata.split(/[,&]/).map((p) => p.trim()).filter(Boolean)) {
    const [key, value = ""] = pair.split("=");
    if (sandbox.metadata?.[key.trim()] !== value.trim()) return false;
  }
  return true;
}

function cpu(sandbox: Sandbox, used: Metric | undefined): string {
  return used ? `${Math.round(used.cpuUsedPct)}% of ${sandbox.cpuCount}` : `${sandbox.cpuCount} vCPU`;
}

function memory(sandbox: Sandbox, used: Metric | undefined): string {
  if (used) return `${Math.round(used.memUsed / 2 ** 20)} / ${sandbox.memoryMB} MiB`;
  return sandbox.hostMemoryMB != null ? `${sandbox.hostMemoryMB} / ${sandbox.memoryMB} MiB` : `${sandbox.memoryMB} MiB`;
}

export function SandboxesPage() {
  const { sandboxes, live, loaded } = useFleet();
  const [filter, setFilter] = useState<Filter>({ state: "", template: "", metadata: "" });
  const [scrollTop, setScrollTop] = useState(0);
  const [viewHeight, setViewHeight] = useState(600);
  const [drawnIn, setDrawnIn] = useState<number | null>(null);

  const rows = useMemo(
    () =>
      [...sandboxes.values()]
        .filter((s) => matches(s, filter))
        .sort((a, b) => (a.startedAt < b.startedAt ? 1 : a.startedAt > b.startedAt ? -1 : a.sandboxID < b.sandboxID ? 1 : -1)),
    [sandboxes, filter],
  );
  const templates = useMemo(() => [...new Set([...sandboxes.values()].map((s) => s.alias || s.templateID))].sort(), [sandboxes]);

  useEffect(() => {
    // From the snapshot's arrival to the frame that shows it.
    if (loaded !== null) requestAnimationFrame(() => setDrawnIn(performance.now() - loaded));
  }, [loaded]);

  const first = Math.max(0, Math.floor(scrollTop / ROW_HEIGHT) - OVERSCAN);
  const last = Math.min(rows.length, Math.ceil((scrollTop + viewHeight) / ROW_HEIGHT) + OVERSCAN);
  const now = Date.now();
  const drawn = rows.slice(first, last);
  const usage = useUsage(drawn.filter((s) => s.state === "running").map((s) => s.sandboxID));

  return (
    <section>
      <header class="page-head">
        <h1>Sandboxes</h1>
        <span class={live ? "badge ok" : "badge warn"} data-testid="live">
          {live ? "live" : "reconnecting"}
        </span>
        <span class="muted" data-testid="sandbox-count" data-drawn-ms={drawnIn === null ? "" : drawnIn.toFixed(1)}>
          {rows.length} of {sandboxes.size}
        </span>
      </header>
      <form class="filters" onSubmit={(e) => e.preventDefault()}>
        <label>
          State{" "}
          <select value={filter.state} onChange={(e) => setFilter({ ...filter, state: e.currentTarget.value })}>
            <option value="">any</option>
            <option value="running">running</option>
            <option value="paused">paused</option>
          </select>
        </label>
        <label>
          Template{" "}
          <select value={filter.template} onChange={(e) => setFilter({ ...filter, template: e.currentTarget.value })}>
            <option value="">any</option>
            {templates.map((t) => (
              <option value={t}>{t}</option>
            ))}
          </select>
        </label>
        <label>
          Metadata <input placeholder="key=value, …" value={filter.metadata} onInput={(e) => setFilter({ ...filter, metadata: e.currentTarget.value })} />
        </label>
      </form>
      <div class="table-head sandbox-row">
        <span>ID</span>
        <span>Template</span>
        <span>State</span>
        <span>Node</span>
        <span>Age</span>
        <span>CPU</span>
        <span>Memory</span>
        <span>Timeout</span>
        <span />
      </div>
      <div
        class="rows"
        data-testid="sandbox-rows"
        ref={(el) => {
          if (el && el.clientHeight !== viewHeight) setViewHeight(el.clientHeight);
        }}
        onScroll={(e) => setScrollTop(e.currentTarget.scrollTop)}
      >
        <div style={{ height: `${rows.length * ROW_HEIGHT}px`, position: "relative" }}>
          {drawn.map((s, i) => (
            <div class="sandbox-row" key={s.sandboxID} data-sandbox={s.sandboxID} style={{ top: `${(first + i) * ROW_HEIGHT}px` }}>
              <a href={`#/sandboxes/${s.sandboxID}`}>{s.sandboxID}</a>
              <span>{s.alias || s.templateID}</span>
              <span class={`state ${s.state}`}>{s.state}</span>
              <span>{s.node ?? "—"}</span>
              <span>{age(s.startedAt, now)}</span>
              <span>{cpu(s, usage.get(s.sandboxID))}</span>
              <span>{memory(s, usage.get(s.sandboxID))}</span>
              <span>{s.state === "running" ? timeLeft(s.endAt, now) : "—"}</span>
              <SandboxActions sandbox={s} compact />
            </div>
          ))}
        </div>
      </div>
    </section>
  );
}
