"""`python -m agentenv.storage.blockd --home <dir> [--config file.toml]`."""

from __future__ import annotations

import argparse
import logging
import sys

from agentenv.config import load_config

from .common import BlockdPaths, config_from_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentenv.storage.blockd")
    parser.add_argument("--home", required=True, help="the server's home directory")
    parser.add_argument("--config", help="TOML config (default: the one the client handed over)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
    )
    handed_over = BlockdPaths.for_home(args.home).config
    if args.config:
        cfg = load_config(args.config)
    elif handed_over.exists():
        cfg = config_from_json(handed_over.read_bytes())
    else:
        cfg = load_config()
    cfg.paths.home = args.home
    # Imported late: pyfuse3 and trio are only needed by the daemon itself.
    from .daemon import run_daemon

    return run_daemon(cfg)


if __name__ == "__main__":
    sys.exit(main())
