// A sandbox's files: a directory at a time, each file downloadable, uploads into it.

import { useEffect, useState } from "preact/hooks";

import type { DirEntry, Envd } from "../envd";
import { Alert } from "../alert";

function save(blob: Blob, name: string): void {
  const url = URL.createObjectURL(blob);
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  link.click();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

export function FilesView({ envd }: { envd: Envd }) {
  const [dir, setDir] = useState(`/home/${envd.user}`);
  const [entries, setEntries] = useState<DirEntry[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [generation, setGeneration] = useState(0);

  useEffect(() => {
    envd
      .listDir(dir)
      .then((found) => {
        setEntries(found.sort((a, b) => a.name.localeCompare(b.name)));
        setError(null);
      })
      .catch((e: Error) => setError(e.message));
  }, [envd, dir, generation]);

  async function upload(files: FileList | null) {
    for (const file of files ? [...files] : []) {
      try {
        await envd.upload(`${dir.replace(/\/$/, "")}/${file.name}`, file);
      } catch (e) {
        setError((e as Error).message);
      }
    }
    setGeneration((g) => g + 1);
  }

  const parent = dir.replace(/\/[^/]+\/?$/, "") || "/";
  return (
    <section class="panel files">
      <header>
        Files in <code data-testid="files-dir">{dir}</code>
        <label class="upload">
          Upload <input type="file" multiple data-testid="upload" onChange={(e) => upload(e.currentTarget.files)} />
        </label>
      </header>
      <Alert message={error} />
      <ul data-testid="files">
        {dir !== "/" && (
          <li>
            <button class="link" onClick={() => setDir(parent)}>
              ..
            </button>
          </li>
        )}
        {entries.map((entry) =>
          entry.type === "FILE_TYPE_DIRECTORY" ? (
            <li>
              <button class="link" onClick={() => setDir(entry.path)}>
                {entry.name}/
              </button>
            </li>
          ) : (
            <li>
              <button class="link" data-file={entry.name} onClick={() => envd.download(entry.path).then((b) => save(b, entry.name), (e: Error) => setError(e.message))}>
                {entry.name}
              </button>
            </li>
          ),
        )}
      </ul>
    </section>
  );
}
