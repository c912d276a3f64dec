"""A local HTTP/1.1 server for the io section: answers every request after a
fixed delay (server side), on 127.0.0.1, asyncio, keep-alive.

    python -m drivers.http_delay PORT DELAY_MS

It prints ``ready`` once listening.  Each connection may carry any number of
requests (keep-alive); the request body, if any, is read and ignored.  The
listen backlog and the open-files limit are raised so that ~1,000 clients can
connect at once.
"""

from __future__ import annotations

import asyncio
import resource
import sys

from drivers.ioclient import read_message

BODY = b"ok"
REPLY = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " + str(len(BODY)).encode()
         + b"\r\nConnection: keep-alive\r\n\r\n" + BODY)


async def serve(port: int, delay: float) -> None:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_message(reader)
                await asyncio.sleep(delay)
                writer.write(REPLY)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(client, "127.0.0.1", port, backlog=4096, reuse_address=True)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(int(argv[0]), float(argv[1]) / 1000))


if __name__ == "__main__":
    main(sys.argv[1:])
