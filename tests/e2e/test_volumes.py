"""Volumes with the unmodified SDK's `Volume` against a live server: create, find, list,
the content API with the volume's token, delete; mounting is refused clearly for now."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import Sandbox, Volume
from e2b.exceptions import VolumePathNotFoundException

from ..live import LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("e2b_env")]


@pytest.fixture(autouse=True)
def volume_api(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_VOLUME_API_URL", server.url)


def test_a_volume_and_its_files(server: LiveServer) -> None:
    name = f"data-{time.time_ns()}"
    volume = Volume.create(name)
    try:
        assert volume.token and volume.name == name
        assert name in [v.name for v in Volume.list()]
        again = Volume.connect(volume.volume_id)
        assert again.token == volume.token
        volume.make_dir("/models/small", force=True)
        volume.write_file("/models/small/weights.bin", b"\x00\x01" * 1000)
        assert volume.read_file("/models/small/weights.bin", format="bytes") == b"\x00\x01" * 1000
        assert [e.name for e in volume.list("/models", depth=2)] == ["small", "weights.bin"]
        info = volume.get_info("/models/small/weights.bin")
        assert (info.size, info.type.value) == (2000, "file")
        volume.update_metadata("/models/small/weights.bin", mode=0o600)
        assert volume.get_info("/models/small/weights.bin").mode == 0o600
        assert volume.exists("/models") and not volume.exists("/nothing")
        volume.remove("/models")
        with pytest.raises(VolumePathNotFoundException):
            volume.read_file("/models/small/weights.bin")
        # The token is the credential: another's, or none, opens nothing.
        url = f"{server.url}/volumecontent/{volume.volume_id}/dir"
        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            assert httpx.get(url, params={"path": "/"}, headers=headers).status_code == 401
        # Mounting into a sandbox is refused with a reason (and makes nothing).
        with pytest.raises(Exception, match="not supported yet"):
            Sandbox.create(volume_mounts={"/mnt/data": volume})
        with pytest.raises(Exception, match="already exists"):
            Volume.create(name)
    finally:
        Volume.destroy(volume.volume_id)
    assert name not in [v.name for v in Volume.list()]
    assert not (server.home / "volumes" / volume.volume_id).exists()
