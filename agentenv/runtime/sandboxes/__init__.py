"""The sandboxes of a node: the operation gate, creation, the warm pool."""
