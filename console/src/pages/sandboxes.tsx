// Every sandbox, kept current by one event stream; filtered in the page and drawn a
// window of rows at a time, so ten thousand rows cost what forty do.

import { useEffect, useMemo, useState } from "preact/hooks";

import type { Sandbox } from "../api";
import { SandboxActions } from "../actions";
import { age, timeLeft } from "../format";
import { useFleet } from "../fleet";

const ROW_HEIGHT = 32;
const OVERSCAN = 10;

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
          {rows.slice(first, last).map((s, i) => (
            <div class="sandbox-row" key={s.sandboxID} data-sandbox={s.sandboxID} style={{ top: `${(first + i) * ROW_HEIGHT}px` }}>
              <a href={`#/sandboxes/${s.sandboxID}`}>{s.sandboxID}</a>
              <span>{s.alias || s.templateID}</span>
              <span class={`state ${s.state}`}>{s.state}</span>
              <span>{s.node ?? "—"}</span>
              <span>{age(s.startedAt, now)}</span>
              <span>{s.cpuCount} vCPU</span>
              <span>{s.hostMemoryMB != null ? `${s.hostMemoryMB} / ${s.memoryMB} MiB` : `${s.memoryMB} MiB`}</span>
              <span>{s.state === "running" ? timeLeft(s.endAt, now) : "—"}</span>
              <SandboxActions sandbox={s} compact />
            </div>
          ))}
        </div>
      </div>
    </section>
  );
}
