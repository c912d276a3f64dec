"""Integrations of pgfence with frameworks: :mod:`pgfence.contrib.django`
(a ``django.tasks`` backend, extra ``pgfence[django]``)."""
