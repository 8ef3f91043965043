"""An object store on S3 or an S3-compatible service (MinIO, Ceph RGW, moto)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import boto3
import botocore.config
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from .objectstore import ObjectNotFound, ObjectStoreError
from .posix import validate_key

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
# Files above this go up as a multipart upload, in parts of this size, several at once.
_MULTIPART = 64 * 1024 * 1024


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3ObjectStore:
    """ObjectStore on one bucket, with keys optionally under `prefix`."""

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        path_style: bool = False,
        access_key: str | None = None,
        secret_key: str | None = None,
        prefix: str = "",
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_attempts: int = 5,
    ) -> None:
        if not bucket:
            raise ValueError("S3ObjectStore needs a bucket")
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        config = botocore.config.Config(
            region_name=region,
            retries={"mode": "standard", "max_attempts": max_attempts},
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            # Worker threads share this client; give them enough pooled connections.
            max_pool_connections=32,
            s3={"addressing_style": "path" if path_style else "auto"},
        )
        # A client is thread-safe once built; building it through a private session avoids
        # the default session, which is not.
        session = boto3.session.Session(
            aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
            region_name=region,
        )
        self._client = session.client("s3", endpoint_url=endpoint_url or None, config=config)
        self._transfer = TransferConfig(
            multipart_threshold=_MULTIPART, multipart_chunksize=_MULTIPART, max_concurrency=4
        )

    def __repr__(self) -> str:
        return f"S3ObjectStore(bucket={self.bucket!r}, prefix={self.prefix!r})"

    def _key(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _fail(self, op: str, key: str, exc: Exception) -> NoReturn:
        if isinstance(exc, ClientError) and _code(exc) in _NOT_FOUND:
            raise ObjectNotFound(key) from exc
        raise ObjectStoreError(f"{op} s3://{self.bucket}/{self.prefix}{key}: {exc}") from exc

    def _call(self, op: str, key: str, method: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, method)(Bucket=self.bucket, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            self._fail(op, key, exc)

    def put(self, key: str, data: bytes) -> None:
        # A single PUT is atomic in S3: readers see the old object or the new one.
        self._call("put", key, "put_object", Key=self._key(key), Body=data)

    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file; multipart above 64 MiB (completed only when all parts are in)."""
        full = self._key(key)
        try:
            self._client.upload_file(str(path), self.bucket, full, Config=self._transfer)
        except (ClientError, BotoCoreError, S3UploadFailedError, OSError) as exc:
            self._fail("put_file", key, exc)

    def _read_body(self, op: str, key: str, response: dict[str, Any]) -> bytes:
        try:
            with response["Body"] as body:
                return body.read()
        except (BotoCoreError, OSError) as exc:
            self._fail(op, key, exc)

    def get(self, key: str) -> bytes:
        response = self._call("get", key, "get_object", Key=self._key(key))
        return self._read_body("get", key, response)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise ValueError(f"bad range start={start} length={length} for {key}")
        full = self._key(key)
        if length == 0:
            # "bytes=a-(a-1)" is not a valid range; still report a missing key.
            if not self.exists(key):
                raise ObjectNotFound(key)
            return b""
        try:
            response = self._client.get_object(
                Bucket=self.bucket, Key=full, Range=f"bytes={start}-{start + length - 1}"
            )
        except ClientError as exc:
            # A range wholly past the end: the protocol says "fewer bytes", here none.
            if _code(exc) == "InvalidRange":
                return b""
            self._fail("get_range", key, exc)
        except BotoCoreError as exc:
            self._fail("get_range", key, exc)
        data = self._read_body("get_range", key, response)
        # Some servers ignore Range and answer 200 with the whole object.
        if response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 200:
            data = data[start : start + length]
        return data

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except ObjectNotFound:
            return False
        return True

    def size(self, key: str) -> int:
        response = self._call("size", key, "head_object", Key=self._key(key))
        return int(response["ContentLength"])

    def delete(self, key: str) -> None:
        # S3 answers 204 for absent keys too, which matches the protocol.
        self._call("delete", key, "delete_object", Key=self._key(key))

    def list(self, prefix: str) -> list[str]:
        return sorted(self._objects(prefix))

    def ages(self, prefix: str) -> dict[str, float]:
        now = datetime.now(UTC)
        return {k: (now - when).total_seconds() for k, when in self._objects(prefix).items()}

    def _objects(self, prefix: str) -> dict[str, datetime]:
        """Keys under `prefix` and when each was last written."""
        if prefix.startswith("/"):
            raise ValueError(f"bad key prefix {prefix!r}")
        objects: dict[str, datetime] = {}
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    objects[obj["Key"][len(self.prefix) :]] = obj["LastModified"]
        except (ClientError, BotoCoreError) as exc:
            self._fail("list", prefix, exc)
        return objects
