"""Pull: an OCI image from a registry becomes block layers in the object store and a template.

Layers already converted over the same parent (by this node or any other sharing the
store) are neither downloaded nor converted again. Concurrent pulls of one image wait for
the first and reuse its work.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from ..errors import Conflict
from ..storage.gc import write_lease
from ..storage.layer import LayerIndex, Stack, chain_id
from ..storage.objectstore import ObjectStore
from .blobs import open_layer_stream
from .convert import convert_layer, format_layer, load_layer, materialize
from .progress import byte_progress
from .reference import ImageRef, parse_reference
from .registry import RegistryClient, ResolvedImage
from .templates import TemplateRecord, TemplateRegistry, validate_name

Progress = Callable[[str], None]


def default_name(ref: ImageRef) -> str:
    """`docker.io/library/ubuntu:22.04` → `ubuntu-22.04`."""
    base = ref.repository.rsplit("/", 1)[-1]
    suffix = ref.tag if not ref.digest else ref.digest.split(":", 1)[1][:12]
    return validate_name(f"{base}-{suffix}".lower().replace("_", "-")[:63])


def pulled_template(templates: TemplateRegistry, ref: ImageRef) -> TemplateRecord | None:
    """The template `ref` was pulled as by a create naming it (its default name), if any."""
    found = templates.find(default_name(ref))
    return found if found is not None and found.source == str(ref) else None


class ImagePuller:
    """Blocking; the server runs it in a worker thread."""

    def __init__(
        self,
        store: ObjectStore,
        registry: RegistryClient,
        templates: TemplateRegistry,
        workdir: Path,
        disk_size: int,
    ) -> None:
        self._store = store
        self.registry = registry
        self._templates = templates
        self._workdir = workdir
        self._disk_size = disk_size
        self._guard = threading.Lock()
        self._image_locks: dict[str, threading.Lock] = {}

    def pull(
        self, reference: str, name: str | None = None, progress: Progress = print
    ) -> TemplateRecord:
        ref = parse_reference(reference)
        name = validate_name(name) if name else default_name(ref)
        progress(f"resolving {ref}")
        resolved = self.registry.resolve(ref)
        with self._guard:
            lock = self._image_locks.setdefault(resolved.digest, threading.Lock())
        # The collector stays out until the record naming the new layers is saved.
        with lock, write_lease(self._store):
            existing = self._templates.find(name)
            if existing is not None and existing.digest == resolved.digest:
                progress(f"{name} is up to date ({resolved.digest})")
                return existing
            layers = self._convert(resolved, progress)
            config = resolved.config
            record = TemplateRecord(
                template_id=name,
                source=str(resolved.ref),
                digest=resolved.digest,
                layers=[layer.layer_id for layer in layers],
                size=self._disk_size,
                env=config.env_dict(),
                workdir=config.working_dir,
                user=config.user,
                entrypoint=list(config.entrypoint) if config.entrypoint else None,
                cmd=list(config.cmd) if config.cmd else None,
            )
            self._templates.save(record)
            progress(f"template {name}: {len(layers)} block layers")
            return record

    def pull_once(self, ref: ImageRef, progress: Progress = print) -> TemplateRecord:
        """The template pulled from `ref` under its default name, pulled now if there is
        none yet (a create's pull, `registry.pull_on_create`: the registry is not asked
        again); Conflict when that name holds another image's template."""
        name = default_name(ref)
        existing = self._templates.find(name)
        if existing is None:
            return self.pull(str(ref), name, progress)
        if existing.source != str(ref):
            raise Conflict(
                f"template '{name}' was pulled from {existing.source}, not {ref}: pull the "
                "image under another name (`aenv pull --name`) and create from that"
            )
        return existing

    def _convert(self, resolved: ResolvedImage, progress: Progress) -> list[LayerIndex]:
        self._workdir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="pull-", dir=self._workdir))
        try:
            layers = [format_layer(self._store, self._disk_size, workdir=work)]
            # `image` holds the full disk of layers[-1] once something needed it.
            image, held = work / "top.img", None
            total = len(resolved.layers)
            for n, (desc, diff_id) in enumerate(
                zip(resolved.layers, resolved.diff_ids, strict=True), 1
            ):
                found = load_layer(self._store, chain_id(layers[-1].layer_id, diff_id))
                if found is not None:
                    progress(f"layer {n}/{total} {desc.digest[:19]}: already converted")
                    layers.append(found)
                    continue
                if held != layers[-1].layer_id:
                    materialize(Stack(layers), self._store, image)
                blob = work / "blob"

                label = f"layer {n}/{total} {desc.digest[:19]}"

                def report(done: int, size: int, label: str = label) -> None:
                    progress(byte_progress(label, done, size))

                self.registry.fetch_blob(resolved.ref, desc, blob, report)
                nxt = work / "next.img"
                with open_layer_stream(blob, desc.media_type) as stream:
                    layer = convert_layer(
                        self._store, image, layers[-1], stream, diff_id, work,
                        result_image=nxt, progress=progress,
                    )  # fmt: skip
                blob.unlink()
                nxt.replace(image)
                held = layer.layer_id
                layers.append(layer)
            return layers
        finally:
            shutil.rmtree(work, ignore_errors=True)
