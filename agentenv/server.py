"""`aenv server`: the API with the node runtime (roles `all`, `node`) or the control plane
in front of nodes (role `control`), in one asyncio process."""

from __future__ import annotations

import uvicorn

from .api.app import create_app
from .config import Config
from .observe.logs import configure_logging
from .proxy.reset import CLIENT_CONNECTIONS

# An idle client connection is kept longer than the SDKs' pools keep theirs (reqwest's
# 90 s): a server closing first races a client reusing it, which then fails mid-request.
KEEP_ALIVE_SECONDS = 120


def run_server(cfg: Config) -> None:
    configure_logging(cfg.server.log_format)
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
    # Its loggers go through ours (format, request ids); it installs none of its own.
    config = uvicorn.Config(
        app,
        host=cfg.server.host,
        port=cfg.server.port,
        log_config=None,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
    server = uvicorn.Server(config)
    CLIENT_CONNECTIONS.attach(server.server_state)
    server.run()
