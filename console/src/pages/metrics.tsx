// How long operations take (the servers' histograms) and how densely sandboxes pack
// memory over the last hour (sampled by the server).

import { useMemo } from "preact/hooks";

import { LineChart } from "../chart";
import { usePolled } from "../polling";
import { Alert } from "../alert";

interface Histogram {
  le: (number | null)[];
  counts: number[];
  count: number;
  sum: number;
}

interface DensityPoint {
  t: number;
  nodes: number;
  running: number;
  paused: number;
  memory_mb: number;
  committed_memory_mb: number;
}

interface Metrics {
  operations: Record<string, Histogram>;
  density: DensityPoint[];
}

/** The bucket bound that the `q` quantile falls under (an upper estimate). */
function quantile(h: Histogram, q: number): string {
  const wanted = q * h.count;
  const at = h.counts.findIndex((c) => c >= wanted);
  if (h.count === 0 || at < 0) return "—";
  const bound = h.le[at];
  return bound === null ? `> ${h.le[at - 1]} s` : `≤ ${bound} s`;
}

function Bars({ name, h }: { name: string; h: Histogram }) {
  const own = h.counts.map((c, i) => c - (i ? h.counts[i - 1] : 0));
  const most = Math.max(1, ...own);
  return (
    <figure class="histogram" data-operation={name}>
      <figcaption>
        <strong>{name}</strong> {h.count} done, mean {h.count ? (h.sum / h.count).toFixed(3) : "—"} s, p50 {quantile(h, 0.5)}, p99 {quantile(h, 0.99)}
      </figcaption>
      {own.map((count, i) => (
        <div class="bar-row">
          <span class="bar-label">{h.le[i] === null ? "more" : `≤ ${h.le[i]} s`}</span>
          <span class="bar" style={{ width: `${(100 * count) / most}%` }} />
          <span class="bar-count">{count}</span>
        </div>
      ))}
    </figure>
  );
}

export function MetricsPage() {
  const polled = usePolled<Metrics>("/console/api/metrics", 10_000);
  const metrics = polled.value;
  const error = metrics ? null : polled.error?.message;
  const density = metrics?.density ?? [];
  const times = useMemo(() => density.map((p) => p.t), [density]);
  const perGiB = density.map((p) => (p.committed_memory_mb ? ((p.running + p.paused) * 1024) / p.committed_memory_mb : 0));

  if (error) return <Alert message={error} />;
  if (!metrics) return <p class="muted">Loading…</p>;
  const operations = Object.entries(metrics.operations).sort(([a], [b]) => a.localeCompare(b));
  return (
    <section>
      <header class="page-head">
        <h1>Metrics</h1>
      </header>
      <h2>Memory density, last hour</h2>
      <div class="charts" data-testid="density">
        <LineChart
          title="Sandboxes"
          times={times}
          series={[
            { label: "running", values: density.map((p) => p.running) },
            { label: "paused", values: density.map((p) => p.paused) },
          ]}
        />
        <LineChart
          title="Memory (MiB)"
          times={times}
          series={[
            { label: "committed", values: density.map((p) => p.committed_memory_mb) },
            { label: "capacity", values: density.map((p) => p.memory_mb) },
          ]}
        />
        <LineChart title="Sandboxes per committed GiB" times={times} series={[{ label: "per GiB", values: perGiB }]} />
      </div>
      <h2>Operations</h2>
      {operations.length === 0 && <p class="muted">No operation has finished yet.</p>}
      <div class="histograms" data-testid="operations">
        {operations.map(([name, h]) => (
          <Bars name={name} h={h} />
        ))}
      </div>
    </section>
  );
}
