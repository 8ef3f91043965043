"""The state store: schema, migrations, sandbox and node records, and their state tables."""
