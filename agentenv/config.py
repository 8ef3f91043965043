"""Server configuration: one TOML file, each key overridable by `AENV_<SECTION>_<KEY>`."""

from __future__ import annotations

import dataclasses
import os
import socket
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def _default_home() -> str:
    return "/var/lib/aenv" if os.geteuid() == 0 else str(Path.home() / ".aenv")


ROLES = ("all", "control", "node")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    # Empty: taken from AENV_API_KEY, else generated on first start and kept in home.
    api_key: str = ""
    # Sandbox domain for `{port}-{id}.{domain}` routing; empty means none.
    domain: str = ""
    # Largest control-plane request body (JSON); file transfers to guests are not bounded.
    max_body_bytes: int = 1024 * 1024
    # API requests a control plane serves at once; past it, 429 with Retry-After at once
    # (sandbox traffic, health and metrics are not counted).
    max_in_flight: int = 400
    # Largest archive of a template build's COPY step (the SDKs upload one per step).
    max_build_file_bytes: int = 2 * 1024**3
    # Largest file one volume content API upload may write.
    max_volume_file_bytes: int = 2 * 1024**3
    # "all": API, proxy and sandboxes in one process (a single machine). In a cluster:
    # "control" (API and proxy in front of nodes, no sandboxes) or "node" (sandboxes).
    role: str = "all"
    # This node's name in a shared state store; empty means the host's name.
    node_name: str = ""
    # Where the control plane reaches this node; empty means http://HOST:PORT.
    advertise_url: str = ""
    # "text", or "json": one object per line with time, level, logger, request id, message.
    log_format: str = "text"
    # Seals hosted secrets and identity signing keys at rest; empty: derived from the API
    # key. Former keys, comma-separated, still open what they sealed (docs/security.md).
    secrets_key: str = ""
    secrets_old_keys: str = ""
    # Make the built-in `code-interpreter-v1` template at start (from the image `aenv kit
    # build` makes), so E2B's code interpreter SDKs work unchanged.
    code_interpreter: bool = True


@dataclass
class PathsConfig:
    home: str = field(default_factory=_default_home)
    # Empty means a folder under home; tests point these at a shared cache.
    kit_dir: str = ""
    images_dir: str = ""
    # Volumes' files; empty means <home>/volumes. In a cluster, a file system every node
    # mounts at this path (each node serves the volumes its own sandboxes mount).
    volumes_dir: str = ""


@dataclass
class SandboxConfig:
    default_timeout: int = 300
    max_timeout: int = 86400
    vcpus: int = 1
    memory_mb: int = 512
    disk_size_mb: int = 4096
    boot_timeout: float = 90.0
    boot_attempts: int = 2
    # Restore sandboxes from a per-shape snapshot of a booted guest instead of booting.
    boot_snapshots: bool = True
    # Host memory/disk kept free; creation waits, then answers 429, below these.
    min_free_memory_mb: int = 512
    min_free_disk_mb: int = 1024
    # Sandboxes' configured memory may sum to host memory times this: below what they
    # hold even at the peak of a burst on TCG (docs/density.md).
    memory_overcommit: float = 3.0
    # Seconds without use and with idle CPUs after which a guest drops its clean caches,
    # so the memory returns to the host (docs/density.md); 0 turns it off.
    reclaim_after_idle: float = 30.0
    # Seconds between samples of running sandboxes' memory (host and guest).
    memory_sample_interval: float = 15.0
    # Host memory pressure: below min_free_memory_mb plus this, idle guests are asked to
    # give memory back; still below min_free_memory_mb, the longest-idle sandboxes pause.
    pressure_margin_mb: int = 1024
    pause_under_pressure: bool = True
    # Let the host kernel merge guest pages identical across sandboxes (KSM, when the host
    # runs it): much denser, but one sandbox may then time another's writes to tell what
    # it holds. For sandboxes of one owner only (docs/density.md).
    merge_identical_pages: bool = False
    # Sandboxes' disks and RAM files may sum to the host's disk times this.
    disk_overcommit: float = 1.0
    # Seconds a create or resume the host has no room for waits in line for room (a
    # sandbox ending or pausing) before it is answered 429 with Retry-After.
    admission_wait: float = 5.0
    # vCPUs one sandbox may have; 0 means the host's CPU count.
    max_vcpus: int = 0
    # Most sandboxes one fork request may start (E2B's SDK itself sends at most 20).
    max_forks: int = 100
    # VMs of the default template and shape kept started ahead of demand (needs boot
    # snapshots): a create takes one and only loads the snapshot's state. Each holds a
    # network namespace, a disk overlay and a waiting VMM.
    warm_pool: int = 0


@dataclass
class VmmConfig:
    # "auto" probes KVM once per host and kernel; "kvm" or "tcg" force one.
    accel: str = "auto"
    qemu_binary: str = "qemu-system-x86_64"
    kvm_probe_timeout: float = 20.0
    # Under TCG, each VM's translated-code cache: it fills during work and stays resident,
    # a memory cost of emulation that KVM does not have (docs/density.md).
    tcg_translation_buffer_mb: int = 64
    # Niceness of the guests' QEMUs (0-19): the node, its proxy and its API are served
    # first when guests want every core, whatever code the guests run.
    guest_nice: int = 5


@dataclass
class NetConfig:
    # Names of namespaces, veths and host chains start with this; two servers on one
    # host (a developer's and the tests') need different prefixes and subnets.
    name_prefix: str = "aenv"
    # Host-side /30 per sandbox is carved from this /16.
    host_subnet: str = "10.199.0.0/16"
    guest_ip: str = "169.254.0.21"
    guest_gateway: str = "169.254.0.22"
    guest_prefix: int = 30
    # Guests reach the internet only; these comma-separated CIDRs (private, link-local...)
    # are opened too. The host's own addresses and other sandboxes stay closed regardless.
    allowed_ranges: str = ""
    # Where guests' DNS queries to their gateway go; empty means the host's resolver.
    dns_server: str = ""
    # PEM file of CAs the egress proxy trusts, besides the host's, for the servers it
    # reaches on guests' behalf when header rules apply (private CAs, test labs).
    egress_trusted_cas: str = ""


@dataclass
class KitConfig:
    mirror: str = "http://deb.debian.org/debian"
    suite: str = "bookworm"
    kernel_package: str = "linux-image-cloud-amd64"


@dataclass
class StorageConfig:
    # Where layers and chunks live durably: "posix" (a directory, possibly shared) or "s3".
    backend: str = "posix"
    # Empty means <home>/objects.
    posix_root: str = ""
    s3_bucket: str = ""
    # Empty means AWS; set it for MinIO, Ceph or another S3-compatible service.
    s3_endpoint: str = ""
    s3_region: str = "us-east-1"
    # Many self-hosted services only answer path-style URLs (endpoint/bucket/key).
    s3_path_style: bool = False
    # Empty: boto3's usual chain (environment, shared files, instance role).
    s3_access_key: str = ""
    s3_secret_key: str = ""
    s3_prefix: str = ""
    # Unreferenced layers and chunks older than this are collected (`aenv gc`, and every
    # `gc_interval` seconds; 0 turns the periodic collection off).
    gc_grace: float = 3600.0
    gc_interval: float = 21600.0


@dataclass
class StateConfig:
    # Where sandbox records live: "sqlite:///ABSOLUTE/PATH" or
    # "postgresql://USER:PASSWORD@HOST:PORT/DB"; empty means <home>/state.db. Nodes that
    # share it (and the object store) resume each other's paused sandboxes.
    url: str = ""
    # Connections this process opens to a PostgreSQL store at most (a pool of up to 5
    # kept, the rest opened for a burst): a cluster's processes together stay below the
    # server's max_connections.
    max_connections: int = 15


@dataclass
class CacheConfig:
    # Bound on the local chunk cache; eviction runs from high_water down to low_water.
    max_bytes: int = 10 * 2**30
    high_water: float = 0.9
    low_water: float = 0.7
    # Empty means <home>/cache.
    dir: str = ""
    # Bound on the template builds' step cache (the disk kept after each RUN and COPY
    # step): past it, the entries least recently built from are deleted.
    build_max_bytes: int = 10 * 2**30


@dataclass
class RegistryConfig:
    # Registries spoken to over plain HTTP besides loopback ones, comma-separated hosts.
    insecure: str = ""
    # Mirrors tried before a registry: "docker.io=https://m1,https://m2;ghcr.io=https://m3".
    mirrors: str = ""
    platform: str = "linux/amd64"
    # Registry credentials in Docker's config.json format; empty means ~/.docker/config.json.
    auth_file: str = ""
    # A create naming a full image reference (with its registry's host) pulls it first;
    # off, a create starts only from templates and snapshots (pulls are explicit).
    pull_on_create: bool = False

    def insecure_hosts(self) -> list[str]:
        return [h.strip() for h in self.insecure.split(",") if h.strip()]

    def mirror_map(self) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
        for entry in filter(None, (e.strip() for e in self.mirrors.split(";"))):
            host, sep, urls = entry.partition("=")
            if not sep or not host.strip():
                raise ConfigError(f"registry.mirrors entry {entry!r} is not host=url[,url]")
            result[host.strip()] = [u.strip() for u in urls.split(",") if u.strip()]
        return result


@dataclass
class ClusterConfig:
    # Seconds between a node's heartbeats into the state store.
    heartbeat_interval: float = 2.0
    # A node silent this long is declared lost: its running sandboxes are gone, its stored
    # paused ones resume on other nodes.
    node_timeout: float = 15.0
    # Place sandboxes on hollow nodes, which run the node's code over machines that start
    # no guest (`cluster/hollow.py`): for tests and benchmarks of the control plane only.
    accept_hollow_nodes: bool = False


@dataclass
class IdentityConfig:
    # The `iss` of workload identity tokens, where verifiers find its keys; empty:
    # https://api.DOMAIN with server.domain, else the advertise URL. One per cluster.
    issuer: str = ""
    # SPIFFE trust domain of the tokens' `sub`; empty: the issuer's host.
    trust_domain: str = ""
    # Seconds a minted token is valid.
    token_ttl: int = 300
    # Seconds between automatic signing key rotations; 0: only `aenv identity rotate`.
    rotation_period: float = 30 * 86400.0
    # Seconds a new signing key is published before it signs (verifiers' caches refresh).
    publish_ahead: float = 3600.0


@dataclass
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    vmm: VmmConfig = field(default_factory=VmmConfig)
    net: NetConfig = field(default_factory=NetConfig)
    kit: KitConfig = field(default_factory=KitConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    state: StateConfig = field(default_factory=StateConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    registry: RegistryConfig = field(default_factory=RegistryConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    identity: IdentityConfig = field(default_factory=IdentityConfig)

    @property
    def home(self) -> Path:
        return Path(self.paths.home)

    @property
    def kit_dir(self) -> Path:
        return Path(self.paths.kit_dir) if self.paths.kit_dir else self.home / "kit"

    @property
    def images_dir(self) -> Path:
        return Path(self.paths.images_dir) if self.paths.images_dir else self.home / "images"

    @property
    def objects_dir(self) -> Path:
        """Root of the posix object store."""
        return Path(self.storage.posix_root) if self.storage.posix_root else self.home / "objects"

    @property
    def cache_dir(self) -> Path:
        return Path(self.cache.dir) if self.cache.dir else self.home / "cache"

    @property
    def volumes_dir(self) -> Path:
        return Path(self.paths.volumes_dir) if self.paths.volumes_dir else self.home / "volumes"

    @property
    def sandboxes_dir(self) -> Path:
        return self.home / "sandboxes"

    @property
    def state_url(self) -> str:
        """`state.url`, or the SQLite file under home; ConfigError for another kind."""
        url = self.state.url
        if not url:
            return f"sqlite:///{self.home / 'state.db'}"
        sqlite_path = url.removeprefix("sqlite:///")
        if sqlite_path != url and sqlite_path:
            return "sqlite:///" + "/" + sqlite_path.lstrip("/")
        if url.startswith(("postgresql://", "postgres://")):
            return url.replace("postgres://", "postgresql://", 1)
        raise ConfigError(
            f"state.url {url!r}: use sqlite:///ABSOLUTE/PATH or postgresql://USER@HOST/DB"
        )

    @property
    def node_name(self) -> str:
        return self.server.node_name or socket.gethostname()

    @property
    def advertise_url(self) -> str:
        return self.server.advertise_url or f"http://{self.server.host}:{self.server.port}"


class ConfigError(ValueError):
    """A configuration file or variable holds an unknown key or a bad value."""


def _coerce(value: str, kind: type) -> Any:
    if kind is bool:
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"not a boolean: {value!r}")
    try:
        return kind(value)
    except ValueError as exc:
        raise ConfigError(f"not a {kind.__name__}: {value!r}") from exc


def load_config(
    path: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None
) -> Config:
    """Defaults, then the TOML file (`path` or `AENV_CONFIG`), then `AENV_<SECTION>_<KEY>`."""
    env = dict(os.environ if env is None else env)
    path = path or env.get("AENV_CONFIG")
    data: dict[str, Any] = {}
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
    cfg = Config()
    sections = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    for name, table in data.items():
        if name not in sections or not isinstance(table, dict):
            raise ConfigError(f"unknown config section [{name}]")
        section = sections[name]
        known = {f.name: f for f in dataclasses.fields(section)}
        for key, value in table.items():
            if key not in known:
                raise ConfigError(f"unknown config key {name}.{key}")
            kind = type(getattr(section, key))
            if not isinstance(value, kind) and not (kind is float and isinstance(value, int)):
                raise ConfigError(f"{name}.{key} must be {kind.__name__}")
            setattr(section, key, kind(value))
    for name, section in sections.items():
        for f in dataclasses.fields(section):
            var = f"AENV_{name}_{f.name}".upper()
            if var in env:
                kind = type(getattr(section, f.name))
                try:
                    setattr(section, f.name, _coerce(env[var], kind))
                except ConfigError as exc:
                    raise ConfigError(f"{var}: {exc}") from exc
    # Short names documented for users: AENV_HOME, AENV_PORT, AENV_API_KEY.
    for var, section, key in (
        ("AENV_HOME", cfg.paths, "home"),
        ("AENV_PORT", cfg.server, "port"),
        ("AENV_API_KEY", cfg.server, "api_key"),
    ):
        if var in env:
            setattr(section, key, _coerce(env[var], type(getattr(section, key))))
    cfg.state_url  # noqa: B018 - a bad state.url stops the server here, not at first use
    if cfg.server.log_format not in ("text", "json"):
        raise ConfigError(f"server.log_format {cfg.server.log_format!r}: use text or json")
    if cfg.server.role not in ROLES:
        raise ConfigError(f"server.role {cfg.server.role!r}: use one of {', '.join(ROLES)}")
    if not 0 <= cfg.vmm.guest_nice <= 19:
        raise ConfigError(f"vmm.guest_nice {cfg.vmm.guest_nice}: use 0 to 19")
    return cfg
