"""Names both ends of a connection must agree on: envd's port and the data plane's headers.

The API, the proxy, the control plane's relay, the CLI and the host's agent client read them
here; the guest's init script gets the port when the initramfs is built.
"""

# The guest agent (E2B's envd) listens here in every sandbox.
ENVD_PORT = 49983

# envd's routes the data plane treats apart: health is open to all, files take a signature
# made from the access token in place of the token itself.
ENVD_HEALTH_ROUTE = "/health"
ENVD_FILES_ROUTE = "/files"

# Data plane: which sandbox and port a request is for (E2B's SDKs send both).
SANDBOX_ID_HEADER = "E2b-Sandbox-Id"
SANDBOX_PORT_HEADER = "E2b-Sandbox-Port"
# The sandbox's envd access token, checked by its agent (and by the proxy for signed URLs).
ACCESS_TOKEN_HEADER = "X-Access-Token"
# With `allowPublicTraffic: false`, requests to a sandbox's own ports carry this token.
TRAFFIC_TOKEN_HEADER = "E2b-Traffic-Access-Token"
# Control-plane calls carry the team's API key.
API_KEY_HEADER = "X-API-Key"
