"""What a sandbox's guest is given at /init (env, user, workdir, the image's command),
kept with each sandbox record, and where a sandbox's disk comes from."""

from __future__ import annotations

from typing import Any

from ...guest.client import AgentClient
from ...images.catalog import Template
from ...state.sandboxes import SandboxRecord
from .mounts import guest_mounts

# In a sandbox's guest config, when it was made from a snapshot (its `template_id` then
# names the snapshot): the template its disk is an overlay of.
DISK_TEMPLATE = "diskTemplate"


def disk_template(record: SandboxRecord) -> str:
    """The template whose image a sandbox's disk sits on."""
    return record.guest.get(DISK_TEMPLATE) or record.template_id


async def init_agent(
    record: SandboxRecord, agent: AgentClient, gateway: str, trusted_ca: str | None
) -> None:
    """`/init` for a sandbox's guest: its token and env vars over its template's, the
    template's user and directory as the defaults, a new clock reading and entropy, its
    volumes (served at its `gateway`) mounted, and the node's egress CA trusted."""
    guest = record.guest
    await agent.init(
        {**guest.get("env", {}), **record.env_vars},
        record.access_token,
        user=guest.get("user") or None,
        workdir=guest.get("workdir") or None,
        volume_mounts=guest_mounts(record, gateway),
        trusted_ca=trusted_ca,
    )


def guest_config(template: Template) -> dict[str, Any]:
    """What a fresh guest of `template` is given at /init; kept with each of its sandboxes."""
    return {
        "env": dict(template.env),
        "user": template.user,
        "workdir": template.workdir,
        "command": list(template.command),
    }
