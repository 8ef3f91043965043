"""A real S3 server (moto in server mode) on a free loopback port, for tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import boto3
from moto.server import ThreadedMotoServer

KEYS = {"access_key": "testing", "secret_key": "testing"}


@contextmanager
def s3_server() -> Iterator[str]:
    """Yields the endpoint URL; the server runs in this process until the block ends."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def new_bucket(endpoint: str) -> str:
    """A fresh bucket, so tests never see each other's keys."""
    name = f"aenv-test-{uuid.uuid4().hex[:12]}"
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=KEYS["access_key"],
        aws_secret_access_key=KEYS["secret_key"],
    )
    client.create_bucket(Bucket=name)
    return name
