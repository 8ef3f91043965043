"""`aenv server`: the control plane and node runtime in one asyncio process."""

from __future__ import annotations

import logging

import uvicorn

from .api.app import create_app
from .config import Config


def run_server(cfg: Config) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg.home.mkdir(parents=True, exist_ok=True)
    app = create_app(cfg)
    print(f"aenv server listening on http://{cfg.server.host}:{cfg.server.port}", flush=True)
    uvicorn.run(app, host=cfg.server.host, port=cfg.server.port, log_level="info")
