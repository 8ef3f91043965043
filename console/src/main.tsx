// The console's shell: sign-in with the API key, then pages chosen by the URL's hash.

import "@xterm/xterm/css/xterm.css";
import "uplot/dist/uPlot.min.css";
import "./style.css";

import { render } from "preact";
import { useEffect, useState } from "preact/hooks";

import { apiKey, keyWorks, onSignOut, signIn, signOut } from "./api";
import { FleetProvider } from "./fleet";
import { MetricsPage } from "./pages/metrics";
import { NodesPage } from "./pages/nodes";
import { SandboxPage } from "./pages/sandbox";
import { SandboxesPage } from "./pages/sandboxes";
import { TemplatesPage } from "./pages/templates";
import { Alert } from "./alert";

function useHash(): string {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const changed = () => setHash(location.hash);
    addEventListener("hashchange", changed);
    return () => removeEventListener("hashchange", changed);
  }, []);
  return hash;
}

function SignIn({ onIn }: { onIn: () => void }) {
  const [key, setKey] = useState("");
  const [error, setError] = useState<string | null>(null);
  async function submit(event: Event) {
    event.preventDefault();
    try {
      if (await keyWorks(key.trim())) {
        signIn(key.trim());
        onIn();
      } else {
        setError("That key is not accepted.");
      }
    } catch (e) {
      setError((e as Error).message);
    }
  }
  return (
    <form class="signin" onSubmit={submit}>
      <h1>AgentENV</h1>
      <label>
        API key <input type="password" autocomplete="off" name="key" value={key} onInput={(e) => setKey(e.currentTarget.value)} />
      </label>
      <button type="submit">Sign in</button>
      <Alert message={error} />
    </form>
  );
}

function Page({ hash }: { hash: string }) {
  const [, section, id] = hash.replace(/^#/, "").split("/");
  if (section === "sandboxes" && id) return <SandboxPage id={decodeURIComponent(id)} />;
  if (section === "nodes") return <NodesPage />;
  if (section === "templates") return <TemplatesPage />;
  if (section === "metrics") return <MetricsPage />;
  return <SandboxesPage />;
}

function App() {
  const [signedIn, setSignedIn] = useState(apiKey() !== null);
  const hash = useHash();
  useEffect(() => onSignOut(() => setSignedIn(false)), []);
  if (!signedIn) return <SignIn onIn={() => setSignedIn(true)} />;
  const current = hash.replace(/^#\/?/, "").split("/")[0] || "sandboxes";
  return (
    <FleetProvider>
      <nav>
        <strong>AgentENV</strong>
        {["sandboxes", "templates", "nodes", "metrics"].map((name) => (
          <a href={`#/${name}`} class={current === name ? "current" : ""}>
            {name[0].toUpperCase() + name.slice(1)}
          </a>
        ))}
        <button class="link" onClick={signOut}>
          Sign out
        </button>
      </nav>
      <main>
        <Page hash={hash} />
      </main>
    </FleetProvider>
  );
}

render(<App />, document.getElementById("app")!);
