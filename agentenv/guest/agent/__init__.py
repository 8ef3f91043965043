"""The AgentENV guest agent: an E2B envd-compatible server that runs inside each microVM.

It must import only the stdlib and aiohttp (>= 3.8.4, Debian bookworm) and only relative
modules, because this directory is copied alone into the runtime disk as ``aenv_agent``.
"""

from __future__ import annotations

__version__ = "0.1.0"
# The envd version whose wire behaviour this agent matches; the control plane should report
# it as the sandbox's envdVersion (the SDK gates features such as octet-stream uploads on it).
# 0.6.2 promises X-Metadata-* file metadata, 0.6.3 entry info in watch events, 0.6.4 the
# opt-in to watching network mounts; all three are implemented.
ENVD_VERSION = "0.6.4"
