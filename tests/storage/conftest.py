"""Object store fixtures: a posix store on tmp_path and S3 on a real (moto) server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from agentenv.storage.objectstore import ObjectStore
from agentenv.storage.posix import PosixObjectStore
from agentenv.storage.s3 import S3ObjectStore

KEYS = {"access_key": "testing", "secret_key": "testing"}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """An S3 server speaking HTTP on a free loopback port, for the whole session."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A fresh bucket per test, so tests never see each other's keys."""
    name = f"aenv-test-{uuid.uuid4().hex[:12]}"
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id=KEYS["access_key"],
        aws_secret_access_key=KEYS["secret_key"],
    )
    client.create_bucket(Bucket=name)
    return name


def make_s3(endpoint: str, bucket: str, **kwargs: object) -> S3ObjectStore:
    return S3ObjectStore(bucket, endpoint_url=endpoint, path_style=True, **KEYS, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(params=["posix", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    """Each backend in turn, for the shared contract tests."""
    if request.param == "posix":
        return PosixObjectStore(tmp_path / "objects")
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    return make_s3(endpoint, bucket, prefix="agentenv")
