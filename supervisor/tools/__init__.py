"""Tooling around the product: the demo, the load test and the mail sink
they talk to."""
