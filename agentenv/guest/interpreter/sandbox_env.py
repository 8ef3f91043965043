"""The sandbox's environment variables, read from the guest agent's ``GET /envs`` with the
access token the SDK forwards."""

from __future__ import annotations

import logging
import os

import aiohttp

log = logging.getLogger("aenv_interpreter")

AGENT_URL = os.environ.get("AENV_AGENT_URL", "http://127.0.0.1:49983")
TIMEOUT = aiohttp.ClientTimeout(total=5)


async def sandbox_envs(access_token: str | None) -> dict[str, str] | None:
    """The agent's variables; None (logged) if it cannot be asked: the code runs without."""
    headers = {"X-Access-Token": access_token} if access_token else {}
    try:
        async with (
            aiohttp.ClientSession(timeout=TIMEOUT) as session,
            session.get(f"{AGENT_URL}/envs", headers=headers) as response,
        ):
            response.raise_for_status()
            body = await response.json()
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        log.warning("cannot read the sandbox's env vars from %s: %s", AGENT_URL, err)
        return None
    if not isinstance(body, dict):
        log.warning("the agent's /envs is not an object")
        return None
    return {str(k): str(v) for k, v in body.items()}
