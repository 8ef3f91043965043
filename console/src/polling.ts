// An API answer asked for again every so often while a page shows it.

import { useEffect, useState } from "preact/hooks";

import { getJson } from "./api";

export interface Polled<T> {
  value: T | null;
  // The last call's failure; the last value stays shown beside it.
  error: Error | null;
}

/** `path` every `every` ms (none while `path` is null); a new `generation` asks at once. */
export function usePolled<T>(path: string | null, every: number, generation = 0): Polled<T> {
  const [polled, setPolled] = useState<Polled<T>>({ value: null, error: null });
  useEffect(() => {
    if (!path) return;
    let stopped = false;
    const tick = () =>
      getJson<T>(path).then(
        (value) => !stopped && setPolled({ value, error: null }),
        (error: Error) => !stopped && setPolled((before) => ({ value: before.value, error })),
      );
    void tick();
    const timer = setInterval(tick, every);
    return () => {
      stopped = true;
      clearInterval(timer);
    };
  }, [path, every, generation]);
  return polled;
}
