"""Observability: Prometheus metrics, their multiprocess directory and the
/metrics server."""
