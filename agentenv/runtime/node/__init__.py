"""A node's start-up and loops: assembly, recovery, heartbeat, adoption, sweeper, memory."""
