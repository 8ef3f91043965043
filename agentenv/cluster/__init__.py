"""A local cluster for trying and testing: PostgreSQL, an S3 server, a control plane and
nodes as processes on this host."""
