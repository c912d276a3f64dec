"""pgfence's SQL: numbered migrations and named queries, read as package
resources."""
