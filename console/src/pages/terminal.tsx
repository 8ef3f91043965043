// A terminal on the sandbox's PTY: a login shell started by process.Process/Start with a
// pty, keystrokes sent by SendInput, the size kept by Update. xterm's DOM renderer keeps
// the screen's text in the page, readable by tests and screen readers.

import { FitAddon } from "@xterm/addon-fit";
import { Terminal } from "@xterm/xterm";
import { useEffect, useRef, useState } from "preact/hooks";

import { Envd, fromBase64, toBase64 } from "../envd";

interface ProcessEvent {
  event?: { start?: { pid: number }; data?: { pty?: string }; end?: { exitCode?: number; status?: string } };
}

/** `running` is read when the view goes: the shell is killed on leaving a running
 * sandbox's page, not when the view goes because the sandbox paused. */
export function TerminalView({ envd, running }: { envd: Envd; running: { current: boolean } }) {
  const host = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState("connecting…");

  useEffect(() => {
    const term = new Terminal({ convertEol: false, cursorBlink: true, fontSize: 13, scrollback: 2000 });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(host.current!);
    fit.fit();
    const stop = new AbortController();
    let pid: number | null = null;
    let sending: Promise<unknown> = Promise.resolve();
    const encoder = new TextEncoder();

    const typed = term.onData((text) => {
      if (pid === null) return;
      const input = { process: { pid }, input: { pty: toBase64(encoder.encode(text)) } };
      // One after another, so keystrokes arrive in the order they were typed.
      sending = sending.then(() => envd.unary("process.Process/SendInput", input)).catch(() => undefined);
    });
    const resized = term.onResize(({ cols, rows }) => {
      if (pid !== null) {
        void envd.unary("process.Process/Update", { process: { pid }, pty: { size: { cols, rows } } }).catch(() => undefined);
      }
    });
    const observer = new ResizeObserver(() => fit.fit());
    observer.observe(host.current!);

    (async () => {
      const request = {
        process: { cmd: "/bin/bash", args: ["-i", "-l"], envs: { TERM: "xterm-256color" } },
        pty: { size: { cols: term.cols, rows: term.rows } },
      };
      try {
        for await (const message of envd.stream("process.Process/Start", request, stop.signal)) {
          const event = (message as ProcessEvent).event;
          if (event?.start) {
            pid = event.start.pid;
            setStatus(`connected (pid ${pid})`);
            term.focus();
          } else if (event?.data?.pty) {
            term.write(fromBase64(event.data.pty));
          } else if (event?.end) {
            setStatus(`exited (${event.end.exitCode ?? event.end.status ?? "?"})`);
          }
        }
      } catch (error) {
        if (!stop.signal.aborted) setStatus(`disconnected: ${(error as Error).message}`);
      }
    })();

    return () => {
      stop.abort();
      observer.disconnect();
      typed.dispose();
      resized.dispose();
      if (pid !== null && running.current) {
        void envd.unary("process.Process/SendSignal", { process: { pid }, signal: "SIGNAL_SIGKILL" }).catch(() => undefined);
      }
      term.dispose();
    };
  }, [envd, running]);

  return (
    <section class="terminal">
      <header>
        Terminal <span class="muted" data-testid="terminal-status">{status}</span>
      </header>
      <div class="terminal-screen" ref={host} data-testid="terminal" />
    </section>
  );
}
