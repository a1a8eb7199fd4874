#!/usr/bin/env python3
"""One TCP port carried from one loopback-only network namespace to another.

The local clusters' namespaces have no interface but `lo`, so nothing in one can
reach the other. A Unix socket is a file, not bound to a network namespace: run

    netns-bridge.py unix-to-tcp SOCKET HOST:PORT   in the namespace that has HOST:PORT
    netns-bridge.py tcp-to-unix HOST:PORT SOCKET   in the namespace that needs it

and connections to HOST:PORT in the second reach HOST:PORT in the first. The e2e
test of two clusters uses it so that the peer cluster's agent reaches the one
control-plane simulator (as every cluster reaches Odoo), and nothing else crosses.
Prints `ready` once listening.
"""

import asyncio
import os
import sys


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def relay(client_reader, client_writer, connect):
    try:
        upstream_reader, upstream_writer = await connect()
    except OSError as e:
        print(f"connect failed: {e}", flush=True)
        client_writer.close()
        return
    await asyncio.gather(pipe(client_reader, upstream_writer), pipe(upstream_reader, client_writer))


def host_port(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


async def main(mode, listen, target):
    if mode == "unix-to-tcp":
        host, port = host_port(target)
        if os.path.exists(listen):
            os.unlink(listen)
        server = await asyncio.start_unix_server(
            lambda r, w: relay(r, w, lambda: asyncio.open_connection(host, port)), path=listen
        )
    elif mode == "tcp-to-unix":
        host, port = host_port(listen)
        server = await asyncio.start_server(
            lambda r, w: relay(r, w, lambda: asyncio.open_unix_connection(target)), host, port
        )
    else:
        sys.exit(f"unknown mode {mode!r}; see the usage at the top of {sys.argv[0]}")
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    asyncio.run(main(*sys.argv[1:]))
