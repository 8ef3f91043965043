"""Host-side commands: `aenv kit build` and `aenv server` (server modules imported lazily)."""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from typing import Any

from agentenv.cli.context import CliError, Context
from agentenv.config import Config, ConfigError, load_config


def load_cfg(path: str | None) -> Config:
    """The server configuration from `path` or `AENV_CONFIG`; a usage error if it is bad."""
    try:
        return load_config(path)
    except ConfigError as exc:
        raise CliError(str(exc), 2) from exc


def import_attr(module: str, name: str) -> Any:
    """`module.name`, or a CliError saying the piece is not installed."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise CliError(f"{module}.{name} is not available: {exc}") from exc


def cmd_kit_build(ctx: Context, args: argparse.Namespace) -> int:
    """Build the guest kit (kernel, initrd, runtime disk), the base template, then the
    code interpreter's root filesystem unless skipped."""
    cfg = load_cfg(args.config)
    build_kit = import_attr("agentenv.guest.kit", "build_kit")
    build_base = import_attr("agentenv.images.base", "build_base_template")
    build_kit(cfg, force=args.force)
    build_base(cfg, force=args.force)
    if args.skip_code_interpreter:
        print("code interpreter image: skipped (`code-interpreter-v1` will not be offered)")
        return 0
    build = import_attr("agentenv.images.codeinterpreter", "build_code_interpreter")
    build(cfg, force=args.force, progress=timed_progress())
    return 0


def timed_progress() -> Callable[[str], None]:
    """Progress lines stamped with the time since the build began (it takes minutes)."""
    t0 = time.monotonic()

    def report(line: str) -> None:
        elapsed = int(time.monotonic() - t0)
        print(f"[{elapsed // 60:2d}:{elapsed % 60:02d}] {line}", flush=True)

    return report


def cmd_server(ctx: Context, args: argparse.Namespace) -> int:
    """Run the API server in the foreground."""
    cfg = load_cfg(args.config)
    if args.host:
        cfg.server.host = args.host
    if args.port is not None:
        cfg.server.port = args.port
    if args.role:
        cfg.server.role = args.role
    run_server = import_attr("agentenv.server", "run_server")
    run_server(cfg)
    return 0
