// Time series drawn by uPlot (a small canvas charting library).

import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";

export interface Series {
  label: string;
  values: number[];
}

const COLOURS = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1"];

export function LineChart({ title, times, series }: { title: string; times: number[]; series: Series[] }) {
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const labels = series.map((s) => s.label).join("|");

  useEffect(() => {
    plot.current = new uPlot(
      {
        title,
        width: 440,
        height: 200,
        series: [{}, ...series.map((s, i) => ({ label: s.label, stroke: COLOURS[i % COLOURS.length], width: 2 }))],
        axes: [{}, { size: 60 }],
      },
      [times, ...series.map((s) => s.values)],
      host.current!,
    );
    return () => plot.current?.destroy();
  }, [title, labels]);

  useEffect(() => {
    plot.current?.setData([times, ...series.map((s) => s.values)]);
  }, [times, series]);

  return <div class="chart" ref={host} />;
}
