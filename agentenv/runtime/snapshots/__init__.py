"""Saved sandboxes: pause and resume, checkpoints, forks, named snapshots, uploads, served RAM."""
