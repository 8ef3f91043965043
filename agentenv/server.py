"""`aenv server`: the API with the node runtime (roles `all`, `node`) or the control plane
in front of nodes (role `control`), in one asyncio process."""

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
    if cfg.server.role == "control":
        from .control.app import create_control_app

        app = create_control_app(cfg)
    else:
        app = create_app(cfg)
    role = cfg.server.role
    print(
        f"aenv server ({role}) listening on http://{cfg.server.host}:{cfg.server.port}", flush=True
    )
    uvicorn.run(app, host=cfg.server.host, port=cfg.server.port, log_level="info")
