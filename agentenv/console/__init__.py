"""The operator console: its built page and assets served at /console, and the event
stream that keeps its sandbox list current (`docs/console.md`)."""
