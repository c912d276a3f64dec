"""Example handlers bundled with pgfence, loaded only when named.

``pgfence.handlers.builtin`` holds small utility kinds for tests and load
tests (``noop``, ``sleep``, ``fail``, ``effect``); ``pgfence.handlers.receipts``
tells the product's story: render, send, record.  They use only pgfence's
public API, as your own handler modules do; the tables they write are in
:mod:`pgfence.handlers.tables`.  pgfence loads no handler module unless one
is named with ``--handlers`` (or ``PGFENCE_HANDLERS``, or the settings file).
"""
