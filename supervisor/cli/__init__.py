"""The `pgfence` command line: argument parsing and sub-commands."""
