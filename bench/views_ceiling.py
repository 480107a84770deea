"""The views bench's ceiling: a bare aiohttp server on the same event loop, answering
every ``GET /tables/{table}/{key}`` with one fixed body (a real answer of the orders
app), with no router beyond that route, no middleware and no table read.

What streamapp's view lookups are measured against (``bench/views.py``, mode
``aiohttp bare``), as raw aiokafka is for throughput: the share of a lookup's cost that
is aiohttp and the kernel's, which no change to streamapp's handler can remove.

    .venv/bin/python bench/views_ceiling.py --port N --body JSON [--event-loop uvloop]
"""

from __future__ import annotations

import argparse
import asyncio

from aiohttp import web


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--body", required=True, help="the JSON body of every answer")
    parser.add_argument("--event-loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    body = args.body.encode()

    async def lookup(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/tables/{table}/{key}", lookup)
    loop: asyncio.AbstractEventLoop
    if args.event_loop == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None, loop=loop)


if __name__ == "__main__":
    main()
