"""`aenv identity keys|rotate`: the workload identity signing keys, through the API."""

from __future__ import annotations

import argparse

from .context import Context
from .output import print_json, render_table


def cmd_identity_keys(ctx: Context, args: argparse.Namespace) -> int:
    """The keys in the JWKS and their state (pending, signing, retiring)."""
    with ctx.api() as api:
        keys = api.call_json("GET", "/identity/keys")
    if (args.output or ("table" if ctx.stdout.isatty() else "json")) == "json":
        print_json(keys, ctx.stdout)
        return 0
    rows = [
        [k["kid"], str(k["generation"]), k["state"], k["createdAt"][:19], k["activeAt"][:19]]
        for k in keys
    ]
    ctx.stdout.write(render_table(("KID", "GENERATION", "STATE", "CREATED", "SIGNS FROM"), rows))
    return 0


def cmd_identity_rotate(ctx: Context, args: argparse.Namespace) -> int:
    """A new signing key: published now, signing after `identity.publish_ahead`."""
    with ctx.api() as api:
        key = api.call_json("POST", "/identity/keys/rotate")
    ctx.stdout.write(f"{key['kid']} {key['state']}, signs from {key['activeAt']}\n")
    return 0
