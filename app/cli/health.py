"""``liar health``: are the database, the broker, the store (and, with ``--workers``, a worker) answering?

    liar health              # exit 0 when the database, the broker and the store answer, 1 otherwise
    liar health --workers    # also require a worker to answer a ping (a worker container's healthcheck)

One line per check on stdout (passwords masked), for a terminal or a container's healthcheck log.
Uses the same environment as the app and the workers (``LIAR_DATABASE_URL``, ``LIAR_BROKER_URL``).
"""

from __future__ import annotations

import argparse

EXIT_UNHEALTHY = 1


def cmd_health(args: argparse.Namespace) -> int:
    from jobs.celery_app import make_celery
    from jobs.health import check_broker, check_database, check_store, check_workers
    from jobs.settings import Settings

    settings = Settings.from_env()
    celery = make_celery(settings)
    checks = [check_database(settings), check_broker(celery), check_store(settings)]
    if args.workers or args.show_workers:
        worker = check_workers(celery, args.timeout)
        checks.append(worker)
    for check in checks:
        print(check.line(), flush=True)
    required = checks if args.workers else checks[:3]
    return 0 if all(c.ok for c in required) else EXIT_UNHEALTHY


def register(sub) -> None:
    """Add ``health`` to the ``liar`` subcommands."""
    what = "check the database, the broker, the store and (optionally) the workers; exit 1 if down"
    h = sub.add_parser("health", help=what)
    h.add_argument("--workers", action="store_true", help="also require at least one worker to answer a ping")
    h.add_argument("--show-workers", action="store_true", help="list the workers that answer, without requiring one")
    h.add_argument("--timeout", type=float, default=1.0, help="seconds to wait for the workers' answers (default 1)")
    h.set_defaults(func=cmd_health)
