"""Wire types of the E2B-compatible API, field names exactly as E2B's."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from ..credentials.identity import TOKEN_TYPES
from ..credentials.vault import usable_name
from ..images.builds import LogLevel
from ..net.rules import MAX_ENTRIES as MAX_RULES
from .limits import MAX_ENTRIES, PRINTABLE, EnvVars, HeaderValues, Metadata

# E2B's bound on `dnsServers`.
MAX_DNS_SERVERS = 10
# Most CPUs a request may ask of a sandbox or template (admission checks the host's).
MAX_VCPUS = 16
MAX_PEM_BYTES = 64 * 1024
HOSTNAME = r"^[A-Za-z0-9._-]+$"


class _Request(BaseModel):
    # Unknown fields are refused, so a feature we lack is never silently ignored.
    model_config = ConfigDict(extra="forbid")


def _at_most_255_bytes(text: str) -> str:
    if len(text.encode("utf-8", "surrogatepass")) > 255:
        raise ValueError("at most 255 bytes")
    return text


class AutoResume(_Request):
    enabled: bool = False


class EgressProxyTls(_Request):
    """TLS on the hop to a SOCKS5 egress proxy (E2B's `SandboxEgressProxyTLSConfig`)."""

    enabled: bool
    # The name the proxy's certificate is checked against (and sent as SNI); default: the
    # host part of its address.
    serverName: str | None = Field(default=None, min_length=1, max_length=253, pattern=HOSTNAME)
    # PEM certificates that replace the host's trust store for this proxy.
    caCert: str | None = Field(default=None, min_length=1, max_length=MAX_PEM_BYTES)

    @model_validator(mode="after")
    def _nothing_when_off(self) -> EgressProxyTls:
        if not self.enabled and (self.serverName is not None or self.caCert is not None):
            raise ValueError("with enabled false, no other field may be set")
        return self


class EgressProxy(_Request):
    """A SOCKS5 server all of a sandbox's allowed outbound TCP is tunnelled through."""

    # `host:port`, the host a name or an IPv4 address.
    address: str = Field(min_length=3, max_length=260, pattern=r"^[A-Za-z0-9._-]+:[0-9]{1,5}$")
    # RFC 1929 allows 255 bytes each.
    username: Annotated[str, AfterValidator(_at_most_255_bytes)] | None = None
    password: Annotated[str, AfterValidator(_at_most_255_bytes)] | None = None
    tls: EgressProxyTls | None = None


class HeaderTransform(_Request):
    """What a rule changes in a matching HTTPS request: headers set (replacing any of the
    same name); values may hold `${e2b.secrets.NAME}` and `${e2b.identity.tokens.NAME}`."""

    headers: HeaderValues | None = None


class NetworkRule(_Request):
    transform: HeaderTransform | None = None


class NetworkEgress(_Request):
    """E2B's egress settings (`PUT /sandboxes/{id}/network` takes these alone)."""

    allowOut: list[str] | None = Field(default=None, max_length=MAX_RULES)
    denyOut: list[str] | None = Field(default=None, max_length=MAX_RULES)
    # Reachable when `allowOut` holds a domain; None: E2B's default, 8.8.8.8; []: none.
    dnsServers: list[str] | None = Field(default=None, max_length=MAX_DNS_SERVERS)
    egressProxy: EgressProxy | None = None
    # Host pattern (`api.example.com`, `*.example.com`) -> rules for its HTTPS requests.
    rules: dict[str, list[NetworkRule]] | None = Field(default=None, max_length=MAX_ENTRIES)


class NetworkUpdate(NetworkEgress):
    """Body of `PUT /sandboxes/{id}/network`: replaces the settings, clearing what it omits."""

    allow_internet_access: bool = True


class SandboxNetwork(NetworkEgress):
    """The `network` option of a create."""

    # False: requests to the sandbox's ports need its `trafficAccessToken`; None: true.
    allowPublicTraffic: bool | None = None
    # The Host header the sandbox's ports see; `${PORT}` stands for the port.
    maskRequestHost: str | None = Field(
        default=None, min_length=1, max_length=256, pattern=PRINTABLE
    )
    # Guest ports serving HTTPS: the proxy reaches them over TLS, without verifying.
    httpsPorts: list[int] | None = Field(default=None, max_length=MAX_ENTRIES)


class VolumeMount(BaseModel):
    """E2B's SandboxVolumeMount: a volume (by name) and where the guest sees it."""

    name: str = Field(min_length=1, max_length=128)
    path: str = Field(min_length=1, max_length=1024)


class IamToken(_Request):
    """A workload identity token the sandbox's egress may have minted."""

    audience: str = Field(min_length=1, max_length=1024, pattern=PRINTABLE)
    tokenType: str = Field(max_length=64)

    @field_validator("tokenType")
    @classmethod
    def _known_type(cls, token_type: str) -> str:
        if token_type not in TOKEN_TYPES:
            raise ValueError(f"token type {token_type[:64]!r} is not available: use JWT-SVID")
        return token_type


class SandboxIam(_Request):
    """E2B's `iam`: the tokens `${e2b.identity.tokens.NAME}` stands for in its egress."""

    tokens: dict[str, IamToken] = Field(default_factory=dict, max_length=64)

    @field_validator("tokens")
    @classmethod
    def _usable_names(cls, tokens: dict[str, IamToken]) -> dict[str, IamToken]:
        for name in tokens:
            if len(name) > 128 or not usable_name(name):
                raise ValueError("token names: 1 to 128 characters, no '{', '}' or control ones")
        return tokens


class NewSandbox(_Request):
    """Body of `POST /sandboxes` and `POST /v2/sandboxes`."""

    templateID: str = Field(min_length=1, max_length=256, pattern=PRINTABLE)
    timeout: int | None = Field(default=None, ge=0, le=10_000_000)
    # CPUs to start with (E2B SDK 2.64+); None: the template's. A template restored from a
    # running guest's snapshot keeps its own (`docs/e2b-compatibility.md`).
    cpuCount: int | None = Field(default=None, ge=1, le=MAX_VCPUS)
    metadata: Metadata = Field(default_factory=dict)
    envVars: EnvVars = Field(default_factory=dict)
    autoPause: bool = False
    # False: a timeout's auto-pause keeps the filesystem only.
    autoPauseMemory: bool = True
    autoResume: AutoResume | None = None
    secure: bool = False
    allow_internet_access: bool = True
    # Not E2B's: pause once the guest has been idle this many seconds (0: never).
    pauseAfterIdle: int = Field(default=0, ge=0, le=10_000_000)
    # MCP servers for the template's `mcp-gateway`, which the SDK itself starts in the new
    # sandbox (killing it if the gateway fails); the server, as E2B's, only accepts it.
    mcp: dict[str, Any] | None = Field(default=None, max_length=MAX_ENTRIES)
    # Named volumes to mount at paths in the guest (`docs/volumes.md`).
    volumeMounts: list[VolumeMount] | None = Field(default=None, max_length=MAX_ENTRIES)
    network: SandboxNetwork | None = None
    iam: SandboxIam | None = None


class TimeoutBody(_Request):
    timeout: int = Field(ge=0, le=10_000_000)


class BalloonBody(_Request):
    targetMB: int = Field(ge=0, le=1_048_576)


class Balloon(BaseModel):
    """A running sandbox's balloon: what it leaves the guest, and what the guest reports."""

    actualMB: int
    totalMB: int | None = None
    freeMB: int | None = None
    availableMB: int | None = None
    diskCachesMB: int | None = None


class RefreshBody(_Request):
    duration: int = Field(default=60, ge=0, le=3600)


class PauseBody(_Request):
    # False: keep the filesystem only; a resume then starts a fresh guest on it.
    memory: bool = True
    # True: refuse (503) while the guest agent does not answer.
    requireHealthyGuest: bool = False
    # Not E2B's. True: answer once the paused state is in the object store, so it
    # outlives this node (`storage: "stored"`).
    waitStored: bool = False


class ConnectBody(_Request):
    timeout: int | None = Field(default=None, ge=0, le=10_000_000)
    # False: start a fresh guest on the paused sandbox's disk instead of its memory.
    memory: bool = True


class ResumeBody(ConnectBody):
    """Body of `POST /sandboxes/{id}/resume` (SDK 2.0-2.5)."""

    # Given: whether the resumed sandbox pauses (true) or is killed at its timeout.
    autoPause: bool | None = None
    # A paused sandbox resumes with the CPUs it had: only those may be named.
    cpuCount: int | None = Field(default=None, ge=1, le=MAX_VCPUS)


class SnapshotBody(_Request):
    """Body of `POST /sandboxes/{id}/snapshots`."""

    name: str | None = Field(default=None, min_length=1, max_length=63)
    # False: keep the filesystem only; sandboxes made from it start a fresh guest.
    memory: bool = True


class RollbackBody(_Request):
    snapshotID: str = Field(min_length=1, max_length=256, pattern=PRINTABLE)


class SnapshotInfo(BaseModel):
    """E2B's fields, then what a snapshot is (E2B's SDK ignores the rest)."""

    snapshotID: str
    names: list[str]
    sandboxID: str
    templateID: str
    memory: bool
    sizeBytes: int
    createdAt: datetime
    # "uploading" until its files are in the object store, then "stored".
    status: Literal["uploading", "stored"]
    uploadError: str | None = None


class ForkBody(_Request):
    timeout: int | None = Field(default=None, ge=0, le=10_000_000)
    # At most `sandbox.max_forks` (checked by the route: it is configuration).
    count: int = Field(default=1, ge=1, le=10_000)


class Sandbox(BaseModel):
    """Answer to create and connect."""

    templateID: str
    sandboxID: str
    clientID: str
    envdVersion: str
    alias: str | None = None
    envdAccessToken: str | None = None
    trafficAccessToken: str | None = None
    domain: str | None = None


class ListedSandbox(BaseModel):
    templateID: str
    alias: str | None = None
    sandboxID: str
    clientID: str
    startedAt: datetime
    endAt: datetime
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    metadata: dict[str, str] = Field(default_factory=dict)
    state: Literal["running", "paused"]
    envdVersion: str
    # The node that runs it or holds its paused files (not in E2B's API).
    node: str | None = None
    # Running, on the node that answers: what it holds in host memory (PSS, MiB).
    hostMemoryMB: int | None = None
    volumeMounts: list[VolumeMount] = Field(default_factory=list)
    # Paused with the memory of a guest whose agent did not answer: resume without memory.
    envdUnresponsiveAtPause: bool | None = None


class SandboxRecordAnswer(BaseModel):
    """E2B's `SandboxRecord` (`GET /unstable/sandboxes/{id}/record`): a sandbox that still
    exists here; its logs and metrics are kept while it does. Made from a listing's fields,
    of which it keeps its own."""

    templateID: str
    alias: str | None = None
    sandboxID: str
    startedAt: datetime
    stoppedAt: datetime | None = None
    cpuCount: int
    memoryMB: int
    diskSizeMB: int
    domain: str | None = None
    retentionExpired: bool = False
    eventsRetentionExpired: bool = False


class Lifecycle(BaseModel):
    autoResume: bool
    onTimeout: Literal["kill", "pause"]


class EgressProxyInfo(BaseModel):
    """A sandbox's egress proxy as shown: never its password."""

    address: str
    username: str | None = None
    tls: EgressProxyTls | None = None


class NetworkInfo(BaseModel):
    allowOut: list[str] | None = None
    denyOut: list[str] | None = None
    allowPublicTraffic: bool = True
    maskRequestHost: str | None = None
    dnsServers: list[str] | None = None
    egressProxy: EgressProxyInfo | None = None
    httpsPorts: list[int] | None = None
    rules: dict[str, list[NetworkRule]] | None = None


class SandboxDetail(ListedSandbox):
    envdAccessToken: str | None = None
    allowInternetAccess: bool | None = None
    network: NetworkInfo | None = None
    domain: str | None = None
    lifecycle: Lifecycle | None = None
    pauseMode: Literal["full", "filesystem"] | None = None
    # Paused only: "uploading" until its files are in the object store, then "stored"
    # (any node sharing the state and object stores can resume it).
    storage: Literal["uploading", "stored"] | None = None


class SandboxMetric(BaseModel):
    timestamp: datetime
    timestampUnix: int
    cpuCount: int
    cpuUsedPct: float
    memUsed: int
    memTotal: int
    memCache: int
    diskUsed: int
    diskTotal: int
    # Not E2B's: what the sandbox's VMM holds in host memory (PSS, bytes).
    hostMemUsed: int | None = None


# E2B's bound on one request for many sandboxes' metrics.
MAX_METRICS_SANDBOXES = 100


class SandboxesWithMetrics(BaseModel):
    """Answer to `GET /sandboxes/metrics`: each sandbox's metric now, by sandbox id."""

    sandboxes: dict[str, SandboxMetric]


class SandboxLogEntry(BaseModel):
    timestamp: datetime
    level: LogLevel
    message: str
    fields: dict[str, str]


class SandboxLogLine(BaseModel):
    timestamp: datetime
    # The entry as JSON (`level`, `logger`, `message` and its fields), as E2B's CLI reads it.
    line: str


class SandboxLogs(BaseModel):
    logs: list[SandboxLogLine]
    logEntries: list[SandboxLogEntry]


class SandboxLogsV2(BaseModel):
    logs: list[SandboxLogEntry]


class NewVolume(_Request):
    name: str = Field(min_length=1, max_length=128)


class Volume(BaseModel):
    """E2B's volume: its id and unique name."""

    volumeID: str
    name: str


class VolumeAndToken(Volume):
    token: str


class VolumeEntry(BaseModel):
    """A file, directory or symlink of a volume (E2B's `VolumeEntryStat`)."""

    name: str
    type: Literal["unknown", "file", "directory", "symlink"]
    path: str
    size: int
    mode: int
    uid: int
    gid: int
    atime: datetime
    mtime: datetime
    ctime: datetime
    target: str | None = None


class PathUpdate(_Request):
    uid: int | None = Field(default=None, ge=0, le=2**32 - 2)
    gid: int | None = Field(default=None, ge=0, le=2**32 - 2)
    mode: int | None = Field(default=None, ge=0, le=0o7777)


class ErrorBody(BaseModel):
    code: int
    message: str
    # E2B's `error_code`, for the failures that have one (`agentenv/errors.py`).
    error_code: str | None = None


class Health(BaseModel):
    status: str
    sandboxes: int
    accelerator: str
