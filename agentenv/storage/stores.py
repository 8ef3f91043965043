"""Build the configured object store and chunk cache."""

from __future__ import annotations

from agentenv.config import Config, ConfigError

from .chunkcache import ChunkCache
from .objectstore import ObjectStore

BACKENDS = ("posix", "s3")


def open_object_store(cfg: Config) -> ObjectStore:
    """The object store named by `[storage]`; ConfigError for an unknown or incomplete one."""
    storage = cfg.storage
    if storage.backend == "posix":
        from .posix import PosixObjectStore

        return PosixObjectStore(cfg.objects_dir)
    if storage.backend == "s3":
        if not storage.s3_bucket:
            raise ConfigError("storage.backend = 's3' needs storage.s3_bucket")
        if bool(storage.s3_access_key) != bool(storage.s3_secret_key):
            raise ConfigError("set storage.s3_access_key and s3_secret_key together, or neither")
        # Imported here so a posix-only installation never loads boto3.
        from .s3 import S3ObjectStore

        return S3ObjectStore(
            storage.s3_bucket,
            endpoint_url=storage.s3_endpoint or None,
            region=storage.s3_region,
            path_style=storage.s3_path_style,
            access_key=storage.s3_access_key or None,
            secret_key=storage.s3_secret_key or None,
            prefix=storage.s3_prefix,
        )
    raise ConfigError(
        f"unknown storage.backend {storage.backend!r}; expected one of {', '.join(BACKENDS)}"
    )


def open_chunk_cache(cfg: Config, store: ObjectStore) -> ChunkCache:
    """The local chunk cache described by `[cache]`, in front of `store`."""
    c = cfg.cache
    if c.max_bytes <= 0:
        raise ConfigError(f"cache.max_bytes must be positive, not {c.max_bytes}")
    if not 0 < c.low_water <= c.high_water <= 1:
        raise ConfigError(
            f"need 0 < cache.low_water ({c.low_water}) <= cache.high_water ({c.high_water}) <= 1"
        )
    return ChunkCache(cfg.cache_dir, store, c.max_bytes, c.high_water, c.low_water)
