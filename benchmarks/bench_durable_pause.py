"""Durable pause: from a pause to its state stored in S3 (a real S3 server, moto), for a
256 MiB and a 1 GiB guest (a server each, sized by `sandbox.memory_mb`) that wrote a
quarter of its memory, next to the floor: the same number of bytes put to the same S3
server straight from the host, in one run.

Prints one JSON line per size: the pause (its answer), pause → stored (a pause with
`waitStored: true`), the bytes the upload wrote, the raw put of as many bytes, and the
ratio. Run: `python -m benchmarks.bench_durable_pause [--sizes 256 1024]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import boto3

from tests.e2e.test_sandbox_lifecycle import run
from tests.live import LiveServer
from tests.s3server import KEYS, new_bucket, s3_server

from .harness import create_sandbox, live_server


def _s3_env(endpoint: str, bucket: str) -> dict[str, str]:
    return {
        "AENV_STORAGE_BACKEND": "s3",
        "AENV_STORAGE_S3_ENDPOINT": endpoint,
        "AENV_STORAGE_S3_BUCKET": bucket,
        "AENV_STORAGE_S3_PATH_STYLE": "true",
        "AENV_STORAGE_S3_ACCESS_KEY": KEYS["access_key"],
        "AENV_STORAGE_S3_SECRET_KEY": KEYS["secret_key"],
    }


def _client(endpoint: str):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=KEYS["access_key"],
        aws_secret_access_key=KEYS["secret_key"],
        region_name="us-east-1",
    )


def _bucket_bytes(endpoint: str, bucket: str) -> int:
    pages = _client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return sum(o["Size"] for page in pages for o in page.get("Contents", []))


def _raw_put(endpoint: str, size: int) -> float:
    """Seconds to put `size` random bytes to a new bucket of the S3 server (boto3's
    multipart upload)."""
    bucket = new_bucket(endpoint)
    with tempfile.NamedTemporaryFile() as data:
        data.write(os.urandom(size))
        data.flush()
        start = time.perf_counter()
        _client(endpoint).upload_file(data.name, bucket, "floor")
        return time.perf_counter() - start


def _paused(server: LiveServer, memory_mb: int, wait_stored: bool) -> float:
    """Seconds a pause of a new sandbox that wrote a quarter of its memory took to answer."""
    sandbox = create_sandbox(server)
    # Data that neither compresses nor repeats, in guest memory (tmpfs).
    fill = f"head -c {memory_mb // 4}M /dev/urandom > /dev/shm/fill"
    assert run(server, sandbox, fill)[2] == 0
    with server.client() as api:
        start = time.perf_counter()
        body = {"waitStored": wait_stored}
        answer = api.post(f"/sandboxes/{sandbox['sandboxID']}/pause", json=body, timeout=600)
        seconds = time.perf_counter() - start
        assert answer.status_code == 204, answer.text
        api.delete(f"/sandboxes/{sandbox['sandboxID']}")
    return seconds


def _size(endpoint: str, memory_mb: int, runs: int) -> dict[str, object]:
    bucket = new_bucket(endpoint)
    env = _s3_env(endpoint, bucket) | {"AENV_SANDBOX_MEMORY_MB": str(memory_mb)}
    with live_server(env) as server:
        create_sandbox(server)  # the shape's boot snapshot, made once
        before = _bucket_bytes(endpoint, bucket)
        stored = [_paused(server, memory_mb, wait_stored=True) for _ in range(runs)]
        written = (_bucket_bytes(endpoint, bucket) - before) // runs
        pauses = [_paused(server, memory_mb, wait_stored=False) for _ in range(runs)]
    floor = statistics.median(_raw_put(endpoint, max(written, 1)) for _ in range(runs))
    return {
        "bench": "durable_pause",
        "memory_mb": memory_mb,
        "written_mb_per_pause": round(written / 2**20, 1),
        "pause_s": round(statistics.median(pauses), 3),
        "pause_to_stored_s": round(statistics.median(stored), 3),
        "raw_put_s": round(floor, 3),
        "stored_over_raw_put": round(statistics.median(stored) / floor, 2),
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with s3_server() as endpoint:
        for memory_mb in args.sizes:
            print(json.dumps(_size(endpoint, memory_mb, args.runs)), flush=True)


if __name__ == "__main__":
    main()
