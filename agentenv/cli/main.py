"""`aenv` entry point: argparse wiring and error reporting only."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import httpx

from agentenv.cli import (
    build,
    cluster,
    commands,
    doctor,
    files,
    host,
    identity,
    snapshots,
    templates,
)
from agentenv.cli.client import ApiError, ServerUnreachable
from agentenv.cli.context import CliError, Context
from agentenv.guest.rpc import ConnectError

Handler = Callable[[Context, argparse.Namespace], int]


def _add(
    sub: argparse._SubParsersAction, name: str, handler: Handler, help_: str, **kw: Any
) -> argparse.ArgumentParser:
    parser = sub.add_parser(name, help=help_, description=help_, **kw)
    parser.set_defaults(handler=handler)
    return parser


def _config_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="server TOML config (default: $AENV_CONFIG)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aenv", description="AgentENV sandboxes from the shell.")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)

    p = _add(sub, "auth", commands.cmd_auth, "store the server URL and API key")
    p.add_argument("--url", help="server URL (default http://127.0.0.1:8000)")
    p.add_argument("--key", help="API key")

    p = _add(sub, "start", commands.cmd_start, "create a sandbox and open a shell in it")
    p.add_argument(
        "template", nargs="?", default="base", help="template or snapshot (default: base)"
    )
    p.add_argument("-d", "--detach", action="store_true", help="print the sandbox id and exit")
    p.add_argument("--timeout", type=int, metavar="SECONDS", help="lifetime (server default 300)")
    p.add_argument("--env", action="append", metavar="K=V", help="sandbox env var (repeatable)")
    p.add_argument("--metadata", action="append", metavar="K=V", help="metadata (repeatable)")
    p.add_argument("--no-internet", action="store_true", help="deny outbound internet access")
    p.add_argument("--secure", action="store_true", help="require an envd access token")
    p.add_argument(
        "--pause-after-idle", type=int, metavar="SECONDS", help="pause once idle this long"
    )

    p = _add(sub, "cn", commands.cmd_cn, "open an interactive shell in a sandbox")
    p.add_argument("id", metavar="ID")

    p = _add(
        sub,
        "exec",
        commands.cmd_exec,
        "run a command in a sandbox",
        usage="aenv exec [-h] ID [--user U] [--cwd DIR] [--env K=V] [--timeout S] -- CMD...",
    )
    p.add_argument("id", metavar="ID")
    p.add_argument("command", nargs="*", metavar="CMD", help="command (after --)")
    p.add_argument("--user", help="run as this user")
    p.add_argument("--cwd", help="working directory")
    p.add_argument("--env", action="append", metavar="K=V", help="env var (repeatable)")
    p.add_argument("--timeout", type=float, metavar="S", help="kill the command after S seconds")

    p = _add(sub, "ls", commands.cmd_ls, "list sandboxes")
    p.add_argument("-o", "--output", choices=("table", "json"), help="default: table on a TTY")
    p.add_argument("--state", metavar="STATES", help="e.g. running or running,paused")
    p.add_argument("--metadata", action="append", metavar="K=V", help="filter (repeatable)")

    p = _add(sub, "rm", commands.cmd_rm, "kill sandboxes")
    p.add_argument("ids", nargs="+", metavar="ID")

    p = _add(sub, "pause", commands.cmd_pause, "pause sandboxes (state saved, VM stopped)")
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("--filesystem", action="store_true", help="keep the disk only, not memory")

    p = _add(sub, "resume", commands.cmd_resume, "resume paused sandboxes where they stopped")
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("--timeout", type=int, metavar="SECONDS", help="lifetime from now")
    p.add_argument("--reboot", action="store_true", help="fresh guest on the disk, no memory")

    p = _add(sub, "rollback", snapshots.cmd_rollback, "put a sandbox back to a snapshot")
    p.add_argument("id", metavar="ID")
    p.add_argument("snapshot", metavar="SNAPSHOT")

    p = _add(sub, "fork", commands.cmd_fork, "fork a running sandbox; print the new ids")
    p.add_argument("id", metavar="ID")
    p.add_argument(
        "--count", type=int, default=1, help="how many forks (default 1, at most sandbox.max_forks)"
    )
    p.add_argument("--timeout", type=int, metavar="SECONDS", help="the forks' lifetime")

    p = _add(sub, "timeout", commands.cmd_timeout, "set a sandbox to expire SECONDS from now")
    p.add_argument("id", metavar="ID")
    p.add_argument("seconds", type=int, metavar="SECONDS")

    p = _add(sub, "balloon", commands.cmd_balloon, "set or show a sandbox's memory balloon")
    p.add_argument("id", metavar="ID")
    p.add_argument("mb", type=int, nargs="?", metavar="MB", help="memory to leave the guest")

    p = _add(sub, "info", commands.cmd_info, "show a sandbox as JSON")
    p.add_argument("id", metavar="ID")

    p = _add(sub, "upload", files.cmd_upload, "copy a local file into a sandbox")
    p.add_argument("id", metavar="ID")
    p.add_argument("local", metavar="LOCAL")
    p.add_argument("remote", metavar="REMOTE")
    p.add_argument("--user", help="owner of the written file")

    p = _add(sub, "download", files.cmd_download, "copy a file out of a sandbox")
    p.add_argument("id", metavar="ID")
    p.add_argument("remote", metavar="REMOTE")
    p.add_argument("local", metavar="LOCAL")
    p.add_argument("--user", help="read as this user")

    p = _add(sub, "pull", templates.cmd_pull, "pull an OCI image into a template")
    p.add_argument("image", metavar="REF", help="image reference, e.g. ubuntu:22.04")
    p.add_argument("--name", help="template name (default: from the reference)")

    p = _add(sub, "build", build.cmd_build, "build a template from a Dockerfile's steps")
    p.add_argument("--name", required=True, help="template name, or name:tag")
    p.add_argument("-f", "--file", default="Dockerfile", help="default: ./Dockerfile")
    p.add_argument("--context", help="directory COPY reads from (default: the Dockerfile's)")
    p.add_argument("--cpu", type=int, help="vCPUs of its sandboxes")
    p.add_argument("--memory", type=int, metavar="MB", help="memory of its sandboxes")
    p.add_argument("--ready-cmd", help="what must succeed before it is ready (with CMD)")
    p.add_argument(
        "--min-free-disk", type=int, metavar="MB", help="free disk space it grows to have"
    )
    p.add_argument("--no-cache", action="store_true", help="run every step again")

    snap = sub.add_parser("snapshot", help="snapshots", description="snapshots")
    snap_sub = snap.add_subparsers(dest="snapshot_command", metavar="COMMAND", required=True)
    p = _add(snap_sub, "create", snapshots.cmd_snapshot_create, "snapshot a running sandbox")
    p.add_argument("id", metavar="ID")
    p.add_argument("--name", help="snapshot name (a new build if it exists)")
    p.add_argument("--filesystem", action="store_true", help="keep the disk only, not memory")
    p = _add(snap_sub, "ls", snapshots.cmd_snapshot_ls, "list snapshots")
    p.add_argument("-o", "--output", choices=("table", "json"), help="default: table on a TTY")
    p.add_argument("--sandbox", metavar="ID", help="only this sandbox's")
    p.add_argument("--name", help="only this name (name or name:tag)")
    p = _add(snap_sub, "rm", templates.cmd_template_rm, "delete snapshots (name or name:tag)")
    p.add_argument("ids", nargs="+", metavar="SNAPSHOT")

    p = _add(sub, "gc", templates.cmd_gc, "delete object-store layers nothing uses any more")
    p.add_argument("--grace", type=float, metavar="SECONDS", help="spare younger objects")

    tpl = sub.add_parser("template", help="templates", description="templates")
    tpl_sub = tpl.add_subparsers(dest="template_command", metavar="COMMAND", required=True)
    p = _add(tpl_sub, "ls", templates.cmd_template_ls, "list templates")
    p.add_argument("-o", "--output", choices=("table", "json"), help="default: table on a TTY")
    p = _add(tpl_sub, "rm", templates.cmd_template_rm, "delete templates")
    p.add_argument("ids", nargs="+", metavar="TEMPLATE")

    p = _add(sub, "doctor", doctor.cmd_doctor, "check this host's prerequisites")
    _config_arg(p)

    kit = sub.add_parser("kit", help="guest kit and built-in templates", description="guest kit")
    kit_sub = kit.add_subparsers(dest="kit_command", metavar="COMMAND", required=True)
    p = _add(
        kit_sub, "build", host.cmd_kit_build,
        "build the guest kit, the base template and the code interpreter's image",
    )  # fmt: skip
    p.add_argument("--force", action="store_true", help="rebuild even if present")
    p.add_argument(
        "--skip-code-interpreter",
        action="store_true",
        help="do not build the code interpreter's image (~2 GB, the longest part)",
    )
    _config_arg(p)

    group = sub.add_parser("cluster", help="a local cluster", description="a local cluster")
    group_sub = group.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    p = _add(group_sub, "up", cluster.cmd_cluster_up, "start PostgreSQL, S3, control and nodes")
    p.add_argument("--nodes", type=int, default=2, help="how many nodes (default 2)")
    p.add_argument("--dir", required=True, help="where the cluster keeps its data and logs")
    p.add_argument("--port", type=int, help="control plane port (default: a free one)")
    p.add_argument(
        "--registry", action="store_true", help="run an OCI registry the nodes pull from"
    )
    _config_arg(p)
    p = _add(group_sub, "status", cluster.cmd_cluster_status, "list the cluster's processes")
    p.add_argument("--dir", required=True)
    p.add_argument("-o", "--output", choices=("table", "json"))
    _config_arg(p)
    p = _add(group_sub, "down", cluster.cmd_cluster_down, "stop everything the cluster started")
    p.add_argument("--dir", required=True)
    _config_arg(p)

    group = sub.add_parser("node", help="a cluster's nodes", description="a cluster's nodes")
    group_sub = group.add_subparsers(dest="node_command", metavar="COMMAND", required=True)
    p = _add(group_sub, "ls", cluster.cmd_node_ls, "list the nodes")
    p.add_argument("-o", "--output", choices=("table", "json"))
    p = _add(group_sub, "drain", cluster.cmd_node_drain, "stop placing on a node")
    p.add_argument("name", metavar="NODE")
    p = _add(group_sub, "activate", cluster.cmd_node_activate, "undo a drain")
    p.add_argument("name", metavar="NODE")
    p = _add(group_sub, "rm", cluster.cmd_node_rm, "forget a node")
    p.add_argument("name", metavar="NODE")
    p = _add(group_sub, "lost", cluster.cmd_node_lost, "sandboxes lost with their node")
    p.add_argument("-o", "--output", choices=("table", "json"))

    group = sub.add_parser(
        "identity", help="workload identity keys", description="workload identity keys"
    )
    group_sub = group.add_subparsers(dest="identity_command", metavar="COMMAND", required=True)
    p = _add(group_sub, "keys", identity.cmd_identity_keys, "list the token signing keys")
    p.add_argument("-o", "--output", choices=("table", "json"))
    _add(group_sub, "rotate", identity.cmd_identity_rotate, "make a new signing key")

    p = _add(sub, "server", host.cmd_server, "run the API server")
    p.add_argument("--host", help="listen address (default from config)")
    p.add_argument("--port", type=int, help="listen port (default from config)")
    p.add_argument(
        "--role",
        choices=("all", "control", "node"),
        help="all: one machine (default); control: API in front of nodes; node: sandboxes",
    )
    _config_arg(p)
    return parser


def _split_exec(argv: list[str]) -> tuple[list[str], list[str]]:
    """For `exec`, everything after the first `--` is the command, options included."""
    if argv[:1] == ["exec"] and "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


def main(argv: list[str] | None = None, ctx: Context | None = None) -> int:
    """Run one command; returns the exit status (the console script exits with it)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    head, tail = _split_exec(argv)
    args = build_parser().parse_args(head)
    if tail:
        args.command = [*args.command, *tail]
    ctx = ctx or Context()
    try:
        return args.handler(ctx, args)
    except CliError as exc:
        ctx.warn(f"error: {exc.message}")
        return exc.exit_code
    except ApiError as exc:
        hint = " (run `aenv auth` or set AENV_API_KEY)" if exc.status == 401 else ""
        ctx.warn(f"error: {exc.message}{hint}")
        return 1
    except ConnectError as exc:
        ctx.warn(f"error: {exc}")
        return 1
    except ServerUnreachable as exc:
        ctx.warn(f"error: {exc}")
        return 1
    except httpx.TimeoutException as exc:
        ctx.warn(f"error: request timed out ({exc.__class__.__name__})")
        return 1
    except httpx.HTTPError as exc:
        ctx.warn(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        ctx.warn("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
