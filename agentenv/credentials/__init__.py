"""Hosted credentials: secrets sealed with the server key, workload identity tokens, and
the placeholders a sandbox's egress resolves to them (`docs/security.md`)."""
