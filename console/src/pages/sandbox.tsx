// One sandbox: what it is, what it may reach, its terminal, files, logs and metrics.

import { useEffect, useMemo, useRef, useState } from "preact/hooks";

import { SandboxActions } from "../actions";
import { getJson, type LogEntry, type Metric, type SandboxDetail } from "../api";
import { LineChart } from "../chart";
import { Envd } from "../envd";
import { usePolled } from "../polling";
import { useFleet } from "../fleet";
import { age, timeLeft } from "../format";
import { FilesView } from "./files";
import { TerminalView } from "./terminal";
import { Alert } from "../alert";

// How often the page asks for new log entries and metric samples.
const REFRESH_MS = 2000;

// The newest log entries shown, at most.
const LOG_LINES = 500;

function LogsView({ id }: { id: string }) {
  const path = `/v2/sandboxes/${id}/logs?direction=backward&limit=${LOG_LINES}`;
  const newestFirst = usePolled<{ logs: LogEntry[] }>(path, REFRESH_MS).value?.logs ?? [];
  const logs = [...newestFirst].reverse();
  return (
    <section class="panel">
      <header>Logs</header>
      <pre class="logs" data-testid="logs">
        {logs.map((entry) => `${entry.timestamp} ${entry.level.padEnd(5)} ${entry.message}\n`).join("")}
      </pre>
    </section>
  );
}

function MetricsView({ id }: { id: string }) {
  const polled = usePolled<Metric[]>(`/sandboxes/${id}/metrics`, REFRESH_MS).value;
  const samples = useMemo(() => polled ?? [], [polled]);
  const times = useMemo(() => samples.map((s) => s.timestampUnix), [samples]);
  return (
    <section class="panel charts">
      <LineChart title="CPU %" times={times} series={[{ label: "CPU %", values: samples.map((s) => s.cpuUsedPct) }]} />
      <LineChart title="Memory (MiB)" times={times} series={[{ label: "used", values: samples.map((s) => s.memUsed / 2 ** 20) }]} />
    </section>
  );
}

export function SandboxPage({ id }: { id: string }) {
  const { sandboxes } = useFleet();
  const [detail, setDetail] = useState<SandboxDetail | null>(null);
  const [error, setError] = useState<string | null>(null);
  const listed = sandboxes.get(id);
  // Read again whenever the stream says its state or node changed.
  const version = listed ? `${listed.state}/${listed.node}/${listed.endAt}` : "";

  useEffect(() => {
    getJson<SandboxDetail>(`/sandboxes/${id}`)
      .then((d) => {
        setDetail(d);
        setError(null);
      })
      .catch((e: Error) => setError(e.message));
  }, [id, version]);

  const running = useRef(false);
  const envd = useMemo(() => (detail ? new Envd(id, detail.envdAccessToken) : null), [id, detail?.envdAccessToken]);
  if (error) return <Alert message={error} />;
  if (!detail) return <p class="muted">Loading {id}…</p>;
  const shown = listed ?? detail;
  running.current = shown.state === "running";
  const now = Date.now();
  return (
    <section>
      <header class="page-head">
        <h1>{id}</h1>
        <span class={`state ${shown.state}`} data-testid="sandbox-state">
          {shown.state}
        </span>
        <SandboxActions sandbox={shown} />
      </header>
      <dl class="facts">
        <dt>Template</dt>
        <dd>{detail.alias || detail.templateID}</dd>
        <dt>Node</dt>
        <dd>{shown.node ?? "—"}</dd>
        <dt>Started</dt>
        <dd>{age(detail.startedAt, now)} ago</dd>
        <dt>Timeout</dt>
        <dd>{shown.state === "running" ? timeLeft(shown.endAt, now) : "—"}</dd>
        <dt>Size</dt>
        <dd>
          {detail.cpuCount} vCPU, {detail.memoryMB} MiB
        </dd>
        {detail.storage && (
          <>
            <dt>Paused state</dt>
            <dd>{detail.storage}</dd>
          </>
        )}
        <dt>Internet</dt>
        <dd>{detail.allowInternetAccess === false ? "denied" : "allowed"}</dd>
        <dt>Network rules</dt>
        <dd>
          <code>{JSON.stringify(detail.network ?? {})}</code>
        </dd>
        <dt>Metadata</dt>
        <dd>
          <code>{JSON.stringify(detail.metadata ?? {})}</code>
        </dd>
      </dl>
      {shown.state === "running" && envd ? (
        <>
          <TerminalView envd={envd} running={running} />
          <FilesView envd={envd} />
          <MetricsView id={id} />
        </>
      ) : (
        <p class="muted">Paused: resume it to open a terminal or its files.</p>
      )}
      <LogsView id={id} />
    </section>
  );
}
