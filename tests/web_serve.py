"""The dashboard served by uvicorn with bulk actions of a chosen batch size,
for the tests that kill the process whose runner is in the middle of one:

    python tests/web_serve.py DSN PORT BATCH
"""

from __future__ import annotations

import sys

import uvicorn

from pgfence.web.app import create_app

if __name__ == "__main__":
    dsn, port, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    uvicorn.run(create_app(dsn, bulk_batch=batch), host="127.0.0.1", port=port, log_level="warning")
