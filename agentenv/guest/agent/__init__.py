"""The AgentENV guest agent: an E2B envd-compatible server that runs inside each microVM.

It must import only the stdlib and aiohttp (>= 3.8.4, Debian bookworm) and only relative
modules, because this directory is copied alone into the runtime disk as ``aenv_agent``.
"""

from __future__ import annotations

__version__ = "0.1.0"
# What /health-checking clients and the SDK compare against (envd feature gates).
ENVD_VERSION = "0.6.2"
