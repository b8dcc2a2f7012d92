"""What the broker holds: the ids of the jobs whose "run job N" message waits in its queue.

Read by ``JobService.resend_lost`` to find QUEUED jobs whose message was lost (Redis restarted
without persistence). Only the two transports a deployment uses can be read this way: the embedded
filesystem queue and Redis.
"""

from __future__ import annotations

import ast
import json

from jobs.settings import Settings


def queued_job_ids(settings: Settings) -> set[int] | None:
    """Job ids of the messages waiting in the broker's queues (None if the broker cannot be read)."""
    try:
        if settings.broker_url.startswith("filesystem://"):
            raw = [p.read_text() for p in (settings.broker_dir / "queue").glob("*.msg")]
        elif settings.broker_url.startswith(("redis://", "rediss://")):
            import redis

            from jobs.routing import queue_names

            client = redis.Redis.from_url(settings.broker_url)  # one list per queue (jobs.routing)
            raw = [item for name in queue_names(settings.queues) for item in client.lrange(name, 0, -1)]
            client.close()
        else:
            return None
        ids = set()
        for item in raw:
            headers = json.loads(item).get("headers", {})
            args = ast.literal_eval(headers.get("argsrepr", "()"))
            if headers.get("task") == "liar.run_job" and args:
                ids.add(int(args[0]))
        return ids
    except Exception:
        return None
