"""The lookup API's process: `python -m streams.lookup.process LISTEN_FD CHANNEL_FD`.

The worker starts it (`streams.lookup.replica.Feed`) with its listening socket and a
channel; it serves `streams.lookup.api`'s handlers from the replica the worker keeps current.
It exits when the channel closes (its worker stopped or died).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

from streams.lookup import api as api_module
from streams.lookup.front import serve
from streams.lookup.metrics import serve_for_worker
from streams.lookup.replica import (
    APPEND,
    APPEND_TIMEOUT_S,
    APPENDED,
    READY,
    STATUS,
    Channel,
    ChildArgs,
    Replica,
    ReplicaCache,
    ReplicaNode,
    apply_yielding,
)
from streams.lookup.serving import RETRY_AFTER_S, ApiError
from streams.runtime.memory import GcPolicy


async def serve_child(listen: socket.socket, sock: socket.socket) -> None:
    """The API process: serve `listen` from the replica the worker feeds through `sock`."""
    channel = await Channel.open(sock)
    messages = channel.messages()
    hello = await anext(messages)
    args: ChildArgs = pickle.loads(hello[1])
    logging.basicConfig(
        level=args.log_level,
        format="[%(asctime)s] [%(process)d] [%(levelname)s] lookup API: %(message)s",
        stream=sys.stderr,
    )
    replica = Replica()
    pending: dict[int, asyncio.Future[tuple[int, int]]] = {}
    ids = iter(range(1, 1 << 62))

    async def append(key: bytes, value: bytes, partition: int) -> tuple[int, int]:
        request = next(ids)
        future: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        pending[request] = future
        channel.send([APPEND, request, key, value, partition])
        try:
            async with asyncio.timeout(APPEND_TIMEOUT_S):
                return await future
        except TimeoutError:
            msg = "the worker did not append the reveal in time; retry"
            raise ApiError(503, msg, retry_after=RETRY_AFTER_S) from None
        finally:
            pending.pop(request, None)

    node = ReplicaNode(args, replica, append)
    server_ssl, client_ssl = api_module.load_tls(*args.tls)
    api = api_module.Api(
        node,
        token=args.token,
        forward_timeout_s=args.forward_timeout_s,
        max_skew_ms=args.max_skew_ms,
        client_ssl=client_ssl,
        app_id=args.app_id,
        peers=args.peers,
        hosts=args.hosts,
        limits=args.limits,
        cache=ReplicaCache(replica),
    )
    runner, api.guard = await serve(
        api_module.build_web_app(api),
        listen,
        args.limits,
        ssl_context=server_ssl,
        app_id=args.app_id,
    )
    channel.send([READY])
    collector = asyncio.create_task(collect_garbage())

    def take(message: list[Any]) -> None:
        if message[0] == STATUS:
            node.take_status(message[1], api.metrics)
            return
        future = pending.get(message[1])
        if future is not None and not future.done():
            if message[4] is None:
                future.set_result((message[2], message[3]))
            else:
                future.set_exception(ApiError(503, message[4], retry_after=RETRY_AFTER_S))

    try:
        await follow(messages, replica, take)
    finally:
        collector.cancel()
        await runner.cleanup()


async def follow(
    messages: AsyncIterator[list[Any]], replica: Replica, take: Callable[[list[Any]], None]
) -> None:
    """Apply the worker's messages to `replica` in the order sent, each one whole before the
    next starts, lookups running between their steps (`apply_yielding`); STATUS and APPENDED
    go to `take`."""
    async for message in messages:
        if message[0] in (STATUS, APPENDED):
            take(message)
        else:  # awaited: the next message is applied only once this one is
            await apply_yielding(replica, message)


async def collect_garbage() -> None:
    """The worker's collector policy (`GcPolicy`), here too: the decoded users are many
    long-lived objects, and full collections walking them paused lookups for far longer than
    a lookup takes, with tens of thousands decoded."""
    memory = GcPolicy(logging.getLogger("oracular.api"))
    GcPolicy.tune()
    memory.freeze()
    while True:
        await asyncio.sleep(GcPolicy.FREEZE_S)
        memory.tick()


def main(argv: list[str]) -> int:
    """`python -m streams.lookup.process LISTEN_FD CHANNEL_FD`: run by the worker, never by hand."""
    if len(argv) != 2:
        print(
            "streams.lookup.process: started by the worker (LISTEN_FD CHANNEL_FD)", file=sys.stderr
        )
        return 2
    # The worker stops it by closing the channel: a Ctrl-C or a SIGTERM sent to the whole
    # process group must not take the API down before the worker (which would restart it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve_for_worker(os.getppid())  # /metrics: the worker's process_* series, and this one's
    listen = socket.socket(fileno=int(argv[0]))
    sock = socket.socket(fileno=int(argv[1]))
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: PLC0415

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(serve_child(listen, sock))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
