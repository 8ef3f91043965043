// A time series drawn by uPlot (a small canvas charting library).

import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";

export function LineChart({ title, times, values }: { title: string; times: number[]; values: number[] }) {
  const host = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);

  useEffect(() => {
    plot.current = new uPlot(
      {
        title,
        width: 420,
        height: 180,
        series: [{}, { label: title, stroke: "#2b6cb0", width: 2 }],
        axes: [{}, { size: 50 }],
        legend: { show: false },
      },
      [[], []],
      host.current!,
    );
    return () => plot.current?.destroy();
  }, [title]);

  useEffect(() => {
    plot.current?.setData([times, values]);
  }, [times, values]);

  return <div class="chart" ref={host} />;
}
