// One server-sent event stream read with fetch (EventSource cannot send the key as a
// header), reconnected after a pause if it drops.

import { ApiError, call } from "./api";

export interface ServerEvent {
  event: string;
  data: string;
}

/** The events in a chunked text stream, split on blank lines as the SSE format says. */
export class EventParser {
  private buffer = "";

  feed(text: string): ServerEvent[] {
    this.buffer += text.replace(/\r\n?/g, "\n");
    const events: ServerEvent[] = [];
    let end: number;
    while ((end = this.buffer.indexOf("\n\n")) >= 0) {
      const block = this.buffer.slice(0, end);
      this.buffer = this.buffer.slice(end + 2);
      let event = "message";
      const data: string[] = [];
      for (const line of block.split("\n")) {
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "event") event = value;
        else if (field === "data") data.push(value);
      }
      if (data.length) events.push({ event, data: data.join("\n") });
    }
    return events;
  }
}

/** Follows `path` until `signal` aborts, handing each event on; `onState` tells whether
 * the stream is up. */
export async function follow(
  path: string,
  onEvent: (event: ServerEvent) => void,
  onState: (up: boolean) => void,
  signal: AbortSignal,
): Promise<void> {
  while (!signal.aborted) {
    try {
      const response = await call(path, { signal, headers: { Accept: "text/event-stream" } });
      const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
      const parser = new EventParser();
      onState(true);
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.feed(value).forEach(onEvent);
      }
    } catch (error) {
      if (signal.aborted || (error instanceof ApiError && error.status === 401)) return;
    }
    onState(false);
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}
