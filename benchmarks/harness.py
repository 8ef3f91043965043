"""A live server for one benchmark run, with its log shown if the run fails."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.live import LiveServer


@contextmanager
def live_server() -> Iterator[LiveServer]:
    with tempfile.TemporaryDirectory(prefix="aenv-bench-") as tmp:
        server = LiveServer(Path(tmp))
        server.start()
        try:
            yield server
        except Exception:
            print(server.log_tail(), file=sys.stderr)
            raise
        finally:
            server.close()
