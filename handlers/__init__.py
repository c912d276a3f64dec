"""Job handlers bundled with pgfence.

``handlers.builtin`` holds small handlers for tests and load tests;
``handlers.receipts`` tells the product's story: render, send, record.
Your own handlers live in your own modules, loaded with ``--handlers``.
"""
