"""Named steps where the fault-injection tests make the server die as a pulled plug would.

`AENV_CRASH_AT=<name>` makes the process SIGKILL itself when it reaches step `<name>`;
unset (always, outside those tests) every step is a no-op.
"""

from __future__ import annotations

import os
import signal

_TARGET = os.environ.get("AENV_CRASH_AT", "")


def crash_point(name: str) -> None:
    if name == _TARGET:
        os.kill(os.getpid(), signal.SIGKILL)
