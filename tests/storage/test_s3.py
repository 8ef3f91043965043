"""The S3 store against a real S3 server (moto): prefixes, multipart, errors, config."""

from __future__ import annotations

from pathlib import Path

import pytest
from boto3.s3.transfer import TransferConfig

from agentenv.config import ConfigError, load_config
from agentenv.storage.objectstore import ObjectNotFound, ObjectStoreError
from agentenv.storage.s3 import S3ObjectStore
from agentenv.storage.stores import open_object_store

from .conftest import make_s3


def test_prefix_keeps_installations_apart(s3_endpoint: str, s3_bucket: str) -> None:
    one = make_s3(s3_endpoint, s3_bucket, prefix="one/")
    two = make_s3(s3_endpoint, s3_bucket, prefix="two")
    bare = make_s3(s3_endpoint, s3_bucket)
    one.put("chunks/a", b"1")
    two.put("chunks/a", b"2")
    assert one.get("chunks/a") == b"1"
    assert two.get("chunks/a") == b"2"
    assert one.list("") == ["chunks/a"]
    assert bare.list("") == ["one/chunks/a", "two/chunks/a"]
    one.delete("chunks/a")
    assert two.exists("chunks/a")


def test_put_file_uses_multipart_for_large_files(
    s3_endpoint: str, s3_bucket: str, tmp_path: Path
) -> None:
    store = make_s3(s3_endpoint, s3_bucket)
    # S3's smallest part is 5 MiB; lower the threshold so 11 MiB needs three parts.
    mib = 1024 * 1024
    store._transfer = TransferConfig(multipart_threshold=5 * mib, multipart_chunksize=5 * mib)
    src = tmp_path / "disk.img"
    payload = b"".join(bytes([i]) * mib for i in range(11))
    src.write_bytes(payload)
    store.put_file("snap/disk.img", src)
    assert store.size("snap/disk.img") == len(payload)
    assert store.get_range("snap/disk.img", 5 * mib - 2, 4) == b"\x04\x04\x05\x05"
    head = store._client.head_object(Bucket=s3_bucket, Key="snap/disk.img")
    assert head["ETag"].strip('"').endswith("-3")  # a multipart ETag counts its parts


def test_missing_bucket_is_a_store_error_naming_the_key(s3_endpoint: str) -> None:
    store = make_s3(s3_endpoint, "no-such-bucket-here")
    with pytest.raises(ObjectStoreError, match="chunks/zz") as err:
        store.put("chunks/zz", b"x")
    assert not isinstance(err.value, ObjectNotFound)


def test_unreachable_endpoint_is_a_store_error() -> None:
    # Port 9 on loopback: nothing listens, the connection is refused at once.
    store = S3ObjectStore(
        "b", endpoint_url="http://127.0.0.1:9", access_key="x", secret_key="y", max_attempts=1
    )
    with pytest.raises(ObjectStoreError, match=r"layers/l\.json"):
        store.get("layers/l.json")


def test_open_object_store_from_config(s3_endpoint: str, s3_bucket: str) -> None:
    cfg = load_config(
        env={
            "AENV_STORAGE_BACKEND": "s3",
            "AENV_STORAGE_S3_BUCKET": s3_bucket,
            "AENV_STORAGE_S3_ENDPOINT": s3_endpoint,
            "AENV_STORAGE_S3_PATH_STYLE": "true",
            "AENV_STORAGE_S3_ACCESS_KEY": "testing",
            "AENV_STORAGE_S3_SECRET_KEY": "testing",
            "AENV_STORAGE_S3_PREFIX": "p",
        }
    )
    store = open_object_store(cfg)
    assert isinstance(store, S3ObjectStore)
    store.put("k", b"v")
    assert make_s3(s3_endpoint, s3_bucket).get("p/k") == b"v"


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"unknown storage\.backend 'gcs'"):
        open_object_store(load_config(env={"AENV_STORAGE_BACKEND": "gcs"}))
    with pytest.raises(ConfigError, match="s3_bucket"):
        open_object_store(load_config(env={"AENV_STORAGE_BACKEND": "s3"}))
    with pytest.raises(ConfigError, match="together"):
        open_object_store(
            load_config(
                env={
                    "AENV_STORAGE_BACKEND": "s3",
                    "AENV_STORAGE_S3_BUCKET": "b",
                    "AENV_STORAGE_S3_ACCESS_KEY": "k",
                }
            )
        )
