"""A flood of Prometheus scrapes, from a process of its own so that the test measuring the server beside it
does not share an interpreter with 500 clients: `python -m tests.support.scrapes BASE_URL COUNT`.

Prints `started` once every scrape is under way, then one JSON line: the status of each answer and how many
answers carried the outbox backlog gauge. Bounded: COUNT requests, each given at most 120 s.
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx


async def _scrape(base: str, count: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)  # a connection each
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=120) as client:
        flood = asyncio.gather(*(client.get("/metrics") for _ in range(count)))
        print("started", flush=True)
        return await flood


def main() -> None:
    base, count = sys.argv[1], int(sys.argv[2])
    answers = asyncio.run(_scrape(base, count))
    statuses = [answer.status_code for answer in answers]
    with_gauge = sum("\nidentity_outbox_backlog " in answer.text for answer in answers)
    print(json.dumps({"statuses": statuses, "withOutboxBacklog": with_gauge}), flush=True)


if __name__ == "__main__":
    main()
