"""The code interpreter's execution service: the API of E2B's code-interpreter SDKs (port
49999) over Jupyter kernels.

It must import only the stdlib, aiohttp and jupyter_client and only relative modules,
because this directory is copied alone into the template's disk as ``aenv_interpreter``.
"""

from __future__ import annotations

PORT = 49999
