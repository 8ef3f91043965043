// The sandboxes as one event stream tells them, shared by every page of a signed-in
// console: one stream per console, not a request per row.

import { createContext, type ComponentChildren } from "preact";
import { useContext, useEffect, useState } from "preact/hooks";

import type { Sandbox } from "./api";
import { follow } from "./live";

export interface Fleet {
  sandboxes: Map<string, Sandbox>;
  live: boolean;
  // When the last whole list arrived (performance.now()), or null before the first.
  loaded: number | null;
}

interface Change {
  upsert: Sandbox[];
  remove: string[];
}

const FleetContext = createContext<Fleet>({ sandboxes: new Map(), live: false, loaded: null });

export function useFleet(): Fleet {
  return useContext(FleetContext);
}

export function FleetProvider({ children }: { children: ComponentChildren }) {
  const [fleet, setFleet] = useState<Fleet>({ sandboxes: new Map(), live: false, loaded: null });
  useEffect(() => {
    const stop = new AbortController();
    void follow(
      "/console/api/sandboxes/events",
      ({ event, data }) => {
        if (event === "snapshot") {
          const all = JSON.parse(data) as { sandboxes: Sandbox[] };
          const sandboxes = new Map(all.sandboxes.map((s) => [s.sandboxID, s]));
          setFleet((f) => ({ ...f, sandboxes, loaded: performance.now() }));
        } else if (event === "change") {
          const change = JSON.parse(data) as Change;
          setFleet((f) => {
            const sandboxes = new Map(f.sandboxes);
            change.remove.forEach((id) => sandboxes.delete(id));
            change.upsert.forEach((s) => sandboxes.set(s.sandboxID, s));
            return { ...f, sandboxes };
          });
        }
      },
      (live) => setFleet((f) => ({ ...f, live })),
      stop.signal,
    );
    return () => stop.abort();
  }, []);
  return <FleetContext.Provider value={fleet}>{children}</FleetContext.Provider>;
}
