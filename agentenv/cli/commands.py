"""Sandbox commands: auth, start, cn, exec, ls, rm, timeout, info."""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import sys
from collections.abc import Callable
from typing import BinaryIO

import httpx

from agentenv.cli.client import ApiClient, ApiError, EnvdClient, ServerUnreachable
from agentenv.cli.context import CliError, Context
from agentenv.cli.credentials import Credentials, credentials_path, read_file, save_credentials
from agentenv.cli.output import print_json, print_sandboxes
from agentenv.cli.process import ProcessResult, ProcessStream, bash_args
from agentenv.cli.terminal import attach_shell
from agentenv.guest.rpc import ConnectError

STATES = ("running", "paused")
KEEPALIVE_SECONDS = 300  # an attached shell keeps its sandbox alive at least this long


def parse_pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    """`["K=V", ...]` → dict; a usage error (exit 2) for an item without `=`."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{flag} expects KEY=VALUE, got {item!r}", 2)
        out[key] = value
    return out


def cmd_auth(ctx: Context, args: argparse.Namespace) -> int:
    """Store the server URL and API key (prompting on a TTY for what is missing)."""
    try:
        stored = read_file() or Credentials()
    except ValueError:
        stored = Credentials()
    interactive = sys.stdin.isatty()
    url = args.url
    if url is None and interactive:
        url = input(f"Server URL [{stored.url}]: ").strip()
    url = (url or stored.url).rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise CliError(f"server URL must start with http:// or https://, got {url!r}", 2)
    key = args.key
    if key is None and interactive:
        hint = " [keep current]" if stored.key else ""
        key = getpass.getpass(f"API key{hint}: ").strip()
    key = key or stored.key
    if not key:
        raise CliError("no API key given: use --key KEY (or run on a terminal to be prompted)", 2)
    path = save_credentials(Credentials(url=url, key=key))
    ctx.stdout.write(f"saved credentials for {url} to {path}\n")
    for var in ("AENV_API_URL", "AENV_API_KEY"):
        if ctx.env.get(var):
            ctx.warn(f"note: {var} is set and overrides {credentials_path()}")
    return 0


def _require_tty(hint: str) -> None:
    if not os.isatty(0):
        raise CliError(f"an interactive shell needs a terminal, but stdin is not a TTY; {hint}")


def _shell(ctx: Context, envd: EnvdClient, wait: bool) -> int:
    if wait:
        try:
            envd.wait_ready()
        except ApiError as exc:
            ctx.warn(f"warning: {exc.message}; trying anyway")

    def keepalive() -> None:
        with ctx.api() as api:
            api.refresh(envd.sandbox_id, KEEPALIVE_SECONDS)

    result = attach_shell(envd, keepalive=keepalive)
    if result is None:
        raise CliError("shell ended without an end event")
    if result.signalled:
        ctx.warn(f"shell ended: {result.status}")
    return result.exit_code


def cmd_start(ctx: Context, args: argparse.Namespace) -> int:
    """Create a sandbox; print its id (`--detach`) or attach a shell."""
    if not args.detach:
        _require_tty("use --detach, then `aenv exec ID -- CMD`")
    body: dict[str, object] = {
        "templateID": args.template,
        "envVars": parse_pairs(args.env, "--env"),
        "metadata": parse_pairs(args.metadata, "--metadata"),
    }
    if args.timeout is not None:
        body["timeout"] = args.timeout
    if args.no_internet:
        body["allow_internet_access"] = False
    if args.secure:
        body["secure"] = True
    if args.pause_after_idle is not None:
        body["pauseAfterIdle"] = args.pause_after_idle
    with ctx.api() as api:
        sbx = api.create_sandbox(body)
    sandbox_id = str(sbx.get("sandboxID") or "")
    if not sandbox_id:
        raise CliError("server answered without a sandboxID")
    if args.detach:
        ctx.stdout.write(sandbox_id + "\n")
        return 0
    ctx.warn(f"sandbox {sandbox_id} started from {args.template}; Ctrl-D leaves the shell")
    with ctx.envd(sandbox_id, str(sbx.get("envdAccessToken") or "")) as envd:
        code = _shell(ctx, envd, wait=True)
    ctx.warn(f"sandbox {sandbox_id} keeps running until its timeout (`aenv rm {sandbox_id}`)")
    return code


def cmd_cn(ctx: Context, args: argparse.Namespace) -> int:
    """Attach an interactive shell to a running sandbox."""
    _require_tty("use `aenv exec ID -- CMD` instead")
    with ctx.envd(args.id) as envd:
        return _shell(ctx, envd, wait=False)


def exec_request(
    command: list[str], envs: dict[str, str], cwd: str | None = None
) -> dict[str, object]:
    """The `Start` body for a one-shot command without stdin: one argument is a script for
    `bash -l -c` (`sh` where the image has no bash); several are run as they are, with no
    shell, as `docker exec` does (so images without any shell work too)."""
    if len(command) == 1:
        process: dict[str, object] = {"cmd": "/bin/bash", "args": bash_args(command[0])}
    else:
        process = {"cmd": command[0], "args": command[1:]}
    process["envs"] = envs
    if cwd:
        process["cwd"] = cwd
    return {"process": process, "stdin": False}


def _writer(stream: BinaryIO) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return write


def cmd_exec(ctx: Context, args: argparse.Namespace) -> int:
    """Run a command, streaming its stdout/stderr; exit with its exit code."""
    if not args.command:
        raise CliError("no command given: aenv exec ID [options] -- CMD...", 2)
    body = exec_request(args.command, parse_pairs(args.env, "--env"), args.cwd)

    with ctx.envd(args.id, user=args.user) as envd:
        stream = ProcessStream(stdout=_writer(ctx.stdout_bin), stderr=_writer(ctx.stderr_bin))
        messages = envd.stream("process.Process/Start", body, timeout=args.timeout or None)
        try:
            result: ProcessResult | None = stream.run(messages)
        except KeyboardInterrupt:
            messages.close()
            if stream.pid:
                kill = {"process": {"pid": stream.pid}, "signal": "SIGNAL_SIGKILL"}
                with contextlib.suppress(ConnectError, ServerUnreachable, httpx.HTTPError):
                    envd.unary("process.Process/SendSignal", kill, timeout=5.0)
            return 130
    if result is None:
        raise CliError("command ended without an end event")
    if result.signalled:
        ctx.warn(f"aenv: remote command ended: {result.status}")
    return result.exit_code


def cmd_ls(ctx: Context, args: argparse.Namespace) -> int:
    """List sandboxes as a table (on a TTY) or JSON."""
    states = [s.strip() for s in (args.state or "").split(",") if s.strip()]
    for state in states:
        if state not in STATES:
            raise CliError(f"--state: unknown state {state!r} (use running, paused)", 2)
    metadata = parse_pairs(args.metadata, "--metadata")
    with ctx.api() as api:
        items = api.list_sandboxes(states, metadata)
    fmt = args.output or ("table" if ctx.stdout.isatty() else "json")
    print_sandboxes(items, fmt, ctx.stdout)
    return 0


def cmd_rm(ctx: Context, args: argparse.Namespace) -> int:
    """Kill each sandbox; report failures and exit 1 if any failed."""
    return _each(ctx, args.ids, lambda api, sandbox_id: api.kill_sandbox(sandbox_id))


def cmd_pause(ctx: Context, args: argparse.Namespace) -> int:
    """Pause sandboxes (their state is saved, their VMs stop); exit 1 if any failed."""
    memory = not args.filesystem
    return _each(ctx, args.ids, lambda api, sandbox_id: api.pause_sandbox(sandbox_id, memory))


def cmd_resume(ctx: Context, args: argparse.Namespace) -> int:
    """Resume paused sandboxes where they stopped (running ones only get the timeout)."""
    memory = not args.reboot
    return _each(
        ctx,
        args.ids,
        lambda api, sandbox_id: api.resume_sandbox(sandbox_id, args.timeout, memory),
    )


def cmd_fork(ctx: Context, args: argparse.Namespace) -> int:
    """Fork a running sandbox: print each new sandbox's id; exit 1 if any fork failed."""
    if args.count < 1:
        raise CliError("--count must be at least 1", 2)
    with ctx.api() as api:
        results = api.fork_sandbox(args.id, args.count, args.timeout)
    failed = False
    for result in results:
        if "sandbox" in result:
            ctx.stdout.write(str(result["sandbox"]["sandboxID"]) + "\n")
        else:
            failed = True
            ctx.warn(f"error: fork failed: {result.get('error', {}).get('message', result)}")
    ctx.stdout.flush()
    return 1 if failed else 0


def _each(ctx: Context, ids: list[str], action: Callable[[ApiClient, str], object]) -> int:
    """Apply `action` to each sandbox, printing the ids that worked; exit 1 if any failed."""
    failed = False
    with ctx.api() as api:
        for sandbox_id in ids:
            try:
                action(api, sandbox_id)
            except ApiError as exc:
                failed = True
                ctx.warn(f"error: {sandbox_id}: {exc.message}")
                continue
            ctx.stdout.write(sandbox_id + "\n")
            ctx.stdout.flush()
    return 1 if failed else 0


def cmd_timeout(ctx: Context, args: argparse.Namespace) -> int:
    """Set a sandbox to expire SECONDS from now."""
    if args.seconds < 0:
        raise CliError("SECONDS must not be negative", 2)
    with ctx.api() as api:
        api.set_timeout(args.id, args.seconds)
    return 0


def cmd_balloon(ctx: Context, args: argparse.Namespace) -> int:
    """Leave a running sandbox's guest MB of its memory (the rest returns to the host);
    without MB, print its balloon and the guest's memory report as JSON."""
    with ctx.api() as api:
        if args.mb is not None:
            api.set_balloon(args.id, args.mb)
        print_json(api.balloon(args.id), ctx.stdout)
    return 0


def cmd_info(ctx: Context, args: argparse.Namespace) -> int:
    """Print `GET /sandboxes/{id}` as JSON."""
    with ctx.api() as api:
        print_json(api.get_sandbox(args.id), ctx.stdout)
    return 0
