"""The built-in `code-interpreter-v1` template, made by the node from the image `aenv kit
build` leaves (`images/codeinterpreter.py`).

On start the node stores that image as template `code-interpreter-rootfs`, then builds
`code-interpreter-v1` on it as any template built from steps: the execution service
(`guest/interpreter`) copied in, started, its health check waited for, and the sandbox
snapshotted with its memory. A create therefore restores a kernel already started.

In a cluster one node builds it: a claim in the shared store (`builtin/…`) says which,
for which inputs, and how far it got; the claimant renews it while it works, so a node
that died mid-build is taken over. A create that arrives during the build waits a while,
then gets a 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import logging
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ...errors import NotFound, TemplateBeingBuilt
from ...guest.kit import load_kit
from ...images.builder import TemplateBuilds
from ...images.buildsteps import Step
from ...images.codeinterpreter import CodeInterpreterImage, load_code_interpreter
from ...images.stepbuild import Recipe
from ...images.templates import TemplateRecord
from ...storage.filelayer import store_file
from ...storage.gc import write_lease
from ...storage.objectstore import ObjectNotFound

log = logging.getLogger(__name__)

TEMPLATE = "code-interpreter-v1"
ROOTFS_TEMPLATE = "code-interpreter-rootfs"
CLAIM_KEY = f"builtin/{TEMPLATE}.json"
SERVICE_SRC = Path(__file__).parents[2] / "guest" / "interpreter"
SERVICE_PACKAGE = "aenv_interpreter"
SERVICE_DIR = f"/opt/aenv/{SERVICE_PACKAGE}"
START_CMD = f"PYTHONPATH=/opt/aenv python3 -m {SERVICE_PACKAGE}"
READY_CMD = "curl -sf http://127.0.0.1:49999/health"
VCPUS, MEMORY_MB = 2, 1024
# Seconds the service has to answer its health check (its Python kernel starts under TCG).
READY_TIMEOUT = 600.0
# Bump when what the node builds changes for the same inputs.
FORMAT = 1
# How long a create waits for a build under way before its 503 (Retry-After: 30).
CREATE_WAIT = 30.0
# A claimant renews its claim this often; one not renewed for CLAIM_STALE is taken over.
CLAIM_RENEW = 15.0
CLAIM_STALE = 90.0
# How often a node that does not build looks at the claim.
POLL = 2.0
_BUILD_HINT = "run `aenv kit build` on the node (without --skip-code-interpreter)"


@dataclass(frozen=True)
class Claim:
    """Who builds the template for which inputs, and how far it got."""

    key: str
    node: str
    state: str  # "building", "ready" or "failed"
    at: float
    reason: str = ""

    def stale(self, now: float) -> bool:
        return self.state == "building" and now - self.at > CLAIM_STALE


class CodeInterpreterTemplate:
    """Makes `code-interpreter-v1` if it is missing or out of date (`ensure`), and tells
    creates how it stands (`await_ready`)."""

    def __init__(
        self,
        builds: TemplateBuilds,
        node_name: str,
        lookup: Callable[[str], object | None],
        service_src: Path = SERVICE_SRC,
    ) -> None:
        self.builds = builds
        self.cfg = builds.cfg
        self.templates = builds.catalog.templates
        self.store = self.templates.store
        self.node_name = node_name
        # The snapshot registry's lookup: the template exists once it finds it.
        self._lookup = lookup
        self.service_src = service_src
        # Why there is no template and none is coming; None while it is (or may be).
        self.missing: str | None = None

    def key(self, image: CodeInterpreterImage, service: bytes) -> str:
        """The inputs of the template: the image, the service's files, the kit, how it runs."""
        kit = load_kit(self.cfg)
        blob = json.dumps(
            [FORMAT, image.version, kit.version if kit else "", START_CMD, READY_CMD,
             VCPUS, MEMORY_MB, hashlib.sha256(service).hexdigest()],
        )  # fmt: skip
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    async def ensure(self) -> None:
        """Build the template unless it is current or another node builds it."""
        try:
            await self._ensure()
        except Exception as exc:
            self.missing = f"template '{TEMPLATE}' could not be built: {exc}"
            log.exception("building %s failed", TEMPLATE)

    async def _ensure(self) -> None:
        image = await asyncio.to_thread(load_code_interpreter, self.cfg)
        if image is None:
            self.missing = f"template '{TEMPLATE}': its image is not built ({_BUILD_HINT})"
            log.warning("%s", self.missing)
            return
        if not self.service_src.is_dir():
            self.missing = f"template '{TEMPLATE}': the execution service is not installed"
            log.warning("%s", self.missing)
            return
        service = await asyncio.to_thread(service_archive, self.service_src)
        key = await asyncio.to_thread(self.key, image, service)
        waited = False
        while True:
            claim = await asyncio.to_thread(self.read_claim)
            if claim is not None and claim.key == key:
                if claim.state == "ready" and await self._exists():
                    log.info("%s is up to date (%s)", TEMPLATE, key)
                    return
                if claim.state == "failed" and waited:
                    # The build this node waited for failed; a node's next start tries again.
                    self.missing = f"template '{TEMPLATE}' failed to build: {claim.reason}"
                    return
                if claim.state == "building" and claim.node != self.node_name:
                    if not claim.stale(time.time()):
                        waited = True
                        await asyncio.sleep(POLL)
                        continue
                    log.warning("%s: node %s stopped building; taking over", TEMPLATE, claim.node)
            if await self._claim(key):
                break
            waited = True
        await self._build(image, key, service)

    async def _exists(self) -> bool:
        return await asyncio.to_thread(self._lookup, TEMPLATE) is not None

    def read_claim(self) -> Claim | None:
        try:
            return Claim(**json.loads(self.store.get(CLAIM_KEY)))
        except (ObjectNotFound, ValueError, TypeError):
            return None

    def _write_claim(self, claim: Claim) -> None:
        self.store.put(CLAIM_KEY, json.dumps(asdict(claim)).encode())

    async def _claim(self, key: str) -> bool:
        """Claim the build; False if another node's claim replaced ours meanwhile (the store
        has no compare-and-swap: the last writer wins, and a short wait lets it show)."""
        mine = Claim(key, self.node_name, "building", time.time())
        await asyncio.to_thread(self._write_claim, mine)
        await asyncio.sleep(POLL)
        now = await asyncio.to_thread(self.read_claim)
        return now is not None and now.node == self.node_name

    async def _build(self, image: CodeInterpreterImage, key: str, service: bytes) -> None:
        t0 = time.monotonic()
        renewer = asyncio.create_task(self._renew(key))
        try:
            with self._log_time("storing the image as template", ROOTFS_TEMPLATE):
                await asyncio.to_thread(self.publish_rootfs, image)
            files_hash = await asyncio.to_thread(self.upload_service, service)
            build = self.builds.register(TEMPLATE, VCPUS, MEMORY_MB)
            build.log(f"built in: {TEMPLATE} from {ROOTFS_TEMPLATE} ({image.version})")
            copy = Step("COPY", (SERVICE_PACKAGE, SERVICE_DIR, "root"), files_hash)
            recipe = Recipe(
                ROOTFS_TEMPLATE, [copy], START_CMD, READY_CMD, ready_timeout=READY_TIMEOUT
            )
            with self._log_time("building", TEMPLATE):
                await self.builds.from_steps(build, recipe, None, None)
        except BaseException as exc:
            reason = str(exc) or type(exc).__name__
            if not isinstance(exc, asyncio.CancelledError):
                await asyncio.to_thread(self._finish, key, "failed", reason)
            raise
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
        if build.status != "ready":
            reason = build.reason or "build failed"
            await asyncio.to_thread(self._finish, key, "failed", reason)
            self.missing = f"template '{TEMPLATE}' failed to build: {reason}"
            log.error("%s", self.missing)
            return
        await asyncio.to_thread(self._finish, key, "ready", "")
        self.missing = None
        log.info("%s built in %.0fs", TEMPLATE, time.monotonic() - t0)

    @contextlib.contextmanager
    def _log_time(self, what: str, name: str) -> Iterator[None]:
        t0 = time.monotonic()
        log.info("%s %s ...", what, name)
        yield
        log.info("%s %s: %.1fs", what, name, time.monotonic() - t0)

    async def _renew(self, key: str) -> None:
        while True:
            await asyncio.sleep(CLAIM_RENEW)
            claim = Claim(key, self.node_name, "building", time.time())
            await asyncio.to_thread(self._write_claim, claim)

    def _finish(self, key: str, state: str, reason: str) -> None:
        self._write_claim(Claim(key, self.node_name, state, time.time(), reason))

    def publish_rootfs(self, image: CodeInterpreterImage) -> TemplateRecord:
        """Blocking: the image as template `code-interpreter-rootfs` (block layers), unless
        that version is stored already."""
        digest = f"{ROOTFS_TEMPLATE}:{image.version}"
        found = self.templates.find(ROOTFS_TEMPLATE)
        if found is not None and found.digest == digest:
            return found
        with write_lease(self.store):
            layer_id, _ = store_file(self.store, image.rootfs, None)
            record = TemplateRecord(
                template_id=ROOTFS_TEMPLATE,
                source="code interpreter image (built in)",
                digest=digest,
                layers=[layer_id],
                size=image.rootfs.stat().st_size,
            )
            self.templates.save(record)
        return record

    def upload_service(self, data: bytes) -> str:
        """Blocking: store the service's archive for a COPY step; its hash."""
        files_hash = hashlib.sha256(data).hexdigest()
        if not self.builds.files.present(files_hash):
            with tempfile.NamedTemporaryFile(dir=self.cfg.home, prefix=".builtin-") as spool:
                spool.write(data)
                spool.flush()
                self.builds.files.put(files_hash, Path(spool.name))
        return files_hash

    async def await_ready(self, wait: float = CREATE_WAIT) -> None:
        """For a create of the template that is not there: wait up to `wait` seconds while
        it is being built; Unavailable (503, Retry-After) if it still is, NotFound with the
        reason if none is coming."""
        deadline = time.monotonic() + wait
        while True:
            if await self._exists():
                return
            claim = await asyncio.to_thread(self.read_claim)
            building = claim is not None and claim.state == "building"
            if not building and self.missing:
                raise NotFound(self.missing)
            if claim is not None and claim.state == "failed":
                raise NotFound(f"template '{TEMPLATE}' failed to build: {claim.reason}")
            if time.monotonic() >= deadline:
                if building or self.missing is None:
                    raise TemplateBeingBuilt(
                        f"template '{TEMPLATE}' is being built (a few minutes after the "
                        f"platform's first start); retry in {TemplateBeingBuilt.retry_after} s"
                    )
                raise NotFound(f"template '{TEMPLATE}' not found")
            await asyncio.sleep(min(POLL, max(0.0, deadline - time.monotonic())))


def service_archive(src: Path) -> bytes:
    """`src` as `aenv_interpreter/…` in a tar whose bytes depend on the files alone
    (sorted, no times or owners), so its hash names its content. Not compressed: gzip's
    header would carry the time."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in [src, *sorted(src.rglob("*"))]:
            rel = path.relative_to(src)
            if "__pycache__" in rel.parts or path.suffix == ".pyc":
                continue
            name = SERVICE_PACKAGE if path == src else f"{SERVICE_PACKAGE}/{rel}"
            info = tar.gettarinfo(str(path), name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isfile():
                with open(path, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    return buf.getvalue()
