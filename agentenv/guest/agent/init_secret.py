"""The host's secret for ``/init``, given to the guest out of band (never over the network).

On a VM the VMM exposes a file to the guest (QEMU: fw_cfg entry `FW_CFG_NAME`); the agent
reads it on every ``/init``, so a guest restored from a snapshot checks the secret of the
VMM it now runs in. Outside a VM (tests) the secret comes from a file named on the
command line.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable
from pathlib import Path

FW_CFG_NAME = "opt/aenv/init-secret"
HEADER = "X-Aenv-Init-Secret"
# Fixed length: the guest kernel sizes fw_cfg files once, at boot (a snapshot's boot too).
SECRET_HEX_CHARS = 64
_GUEST_PATH = Path("/sys/firmware/qemu_fw_cfg/by_name") / FW_CFG_NAME / "raw"

SecretSource = Callable[[], str | None]


def new_secret() -> str:
    return secrets.token_hex(SECRET_HEX_CHARS // 2)


def file_source(path: str | Path) -> SecretSource:
    """Reads the secret from `path` on each call; None when it is missing or empty."""

    def read() -> str | None:
        try:
            return Path(path).read_text().strip() or None
        except OSError:
            return None

    return read


def no_source() -> str | None:
    """No secret anywhere: /init refuses every caller."""
    return None


def guest_source() -> SecretSource:
    return file_source(_GUEST_PATH)


def secret_ok(source: SecretSource, given: str) -> bool:
    """True only when a secret exists and `given` is it: without one, /init stays closed."""
    expected = source()
    return expected is not None and hmac.compare_digest(given.encode(), expected.encode())
