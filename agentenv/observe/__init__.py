"""What operators see: Prometheus metrics, request ids, structured logs."""
