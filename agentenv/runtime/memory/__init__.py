"""What sandboxes commit and use of a node's memory: admission and sampled guest metrics."""
