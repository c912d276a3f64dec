"""No models: pgfence's tables are its own schema's (``pgfence.*``),
applied by ``manage.py migrate`` through the app's post-migrate step
(Django sends that step only to apps that have a models module)."""
