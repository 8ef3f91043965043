"""`aenv cluster up|status|down` (a local cluster) and `aenv node ls|drain|rm` (any
cluster's nodes, through its control plane)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from urllib.parse import quote

from .context import CliError, Context
from .host import import_attr, load_cfg
from .output import print_json, render_table


def _cluster(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    local_cluster = import_attr("agentenv.cluster.local", "LocalCluster")
    return local_cluster(Path(args.dir), load_cfg(args.config))


def cmd_cluster_up(ctx: Context, args: argparse.Namespace) -> int:
    """Start PostgreSQL, an S3 server, a control plane and N nodes; print how to use it."""
    if args.nodes < 1:
        raise CliError("a cluster needs at least one node")
    cfg = load_cfg(args.config)
    # Every node boots from the host's kit and base template: built once, here. Progress
    # goes to stderr: stdout is only the exports, for `eval "$(aenv cluster up ...)"`.
    with contextlib.redirect_stdout(sys.stderr):
        import_attr("agentenv.guest.kit", "build_kit")(cfg)
        import_attr("agentenv.images.base", "build_base_template")(cfg)
    error = import_attr("agentenv.cluster.local", "ClusterError")
    try:
        state = _cluster(args).up(args.nodes, port=args.port, registry=args.registry)
    except error as exc:
        raise CliError(str(exc)) from exc
    ctx.stdout.write(f"export AENV_API_URL={state.control.url}\n")
    ctx.stdout.write(f"export AENV_API_KEY={state.api_key}\n")
    ctx.stdout.write(f"export E2B_API_URL={state.control.url}\n")
    ctx.stdout.write(f"export E2B_API_KEY={state.api_key}\n")
    if state.registry:
        ctx.stdout.write(f"# images pushed to {state.registry} are what the nodes pull\n")
    return 0


def cmd_cluster_status(ctx: Context, args: argparse.Namespace) -> int:
    rows = _cluster(args).status()
    if not rows:
        raise CliError(f"no cluster in {args.dir}")
    if (args.output or ("table" if ctx.stdout.isatty() else "json")) == "json":
        print_json(rows, ctx.stdout)
        return 0
    table = [[r["name"], r["role"], r["state"], str(r["pid"]), r["url"], r["home"]] for r in rows]
    ctx.stdout.write(render_table(("NAME", "ROLE", "STATE", "PID", "URL", "HOME"), table))
    return 0 if all(r["state"] == "up" for r in rows) else 1


def cmd_cluster_down(ctx: Context, args: argparse.Namespace) -> int:
    _cluster(args).down()
    return 0


def cmd_node_ls(ctx: Context, args: argparse.Namespace) -> int:
    with ctx.api() as api:
        nodes = api.call_json("GET", "/nodes")
    if (args.output or ("table" if ctx.stdout.isatty() else "json")) == "json":
        print_json(nodes, ctx.stdout)
        return 0
    rows = [
        [n["name"], n["state"], n["url"], str(n["capacity"].get("running", 0)),
         str(n["capacity"].get("paused", 0)),
         f"{n['capacity'].get('committed_memory_mb', 0)}/{n['capacity'].get('memory_mb', 0)}",
         f"{n['heartbeatAgeSeconds']}s"]
        for n in nodes
    ]  # fmt: skip
    header = ("NODE", "STATE", "URL", "RUNNING", "PAUSED", "MEMORY MB", "HEARTBEAT")
    ctx.stdout.write(render_table(header, rows))
    return 0


def cmd_node_drain(ctx: Context, args: argparse.Namespace) -> int:
    """No new sandboxes on the node; its paused ones move on their next resume."""
    with ctx.api() as api:
        api.call_json("POST", f"/nodes/{quote(args.name, safe='')}/drain")
    return 0


def cmd_node_activate(ctx: Context, args: argparse.Namespace) -> int:
    """Undo a drain: the node takes new sandboxes again."""
    with ctx.api() as api:
        api.call_json("POST", f"/nodes/{quote(args.name, safe='')}/activate")
    return 0


def cmd_node_rm(ctx: Context, args: argparse.Namespace) -> int:
    """Forget the node: its stored paused sandboxes resume elsewhere, the rest are gone."""
    with ctx.api() as api:
        api.call_json("DELETE", f"/nodes/{quote(args.name, safe='')}")
    return 0


def cmd_node_lost(ctx: Context, args: argparse.Namespace) -> int:
    """The sandboxes lost nodes took with them, newest first."""
    with ctx.api() as api:
        lost = api.call_json("GET", "/lost-sandboxes")
    if (args.output or ("table" if ctx.stdout.isatty() else "json")) == "json":
        print_json(lost, ctx.stdout)
        return 0
    rows = [[s["sandboxID"], s["node"], s["state"], s["lostAt"], s["reason"]] for s in lost]
    ctx.stdout.write(render_table(("SANDBOX", "NODE", "STATE", "LOST AT", "REASON"), rows))
    return 0
