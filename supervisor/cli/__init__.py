"""The `pgfence` command line: argument parsing, sub-commands and the
admin commands."""
