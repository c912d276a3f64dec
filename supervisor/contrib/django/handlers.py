"""The handler module ``manage.py pgfence run`` and ``work`` load
(``--handlers pgfence.contrib.django.handlers``): importing it registers
every task of the Django project on a pgfence backend as a pgfence handler
(:func:`pgfence.contrib.django.runner.register_all`).  Django must be set
up first, as ``manage.py`` does."""

from __future__ import annotations

from pgfence.contrib.django.runner import register_all

#: The kinds of the tasks registered, sorted.
KINDS = register_all()
