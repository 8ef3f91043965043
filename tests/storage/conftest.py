"""Object store fixtures: a posix store on tmp_path and S3 on a real (moto) server."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentenv.storage.objectstore import ObjectStore
from agentenv.storage.posix import PosixObjectStore
from agentenv.storage.s3 import S3ObjectStore

from ..s3server import KEYS


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
