"""A node's runtime, in rooms: machine and memory below, sandboxes, snapshots, node above."""
