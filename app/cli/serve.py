"""``liar app``: the web app, with an embedded worker unless ``--no-worker``."""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import subprocess
import sys
from pathlib import Path


def bundled_assets(data_dir: Path) -> tuple[list[str], list[str], list[str]]:
    """The New-run pickers' models, calibration texts and held-out texts (``app.cli.firstrun``)."""
    from app.cli.firstrun import bundled_assets as assets

    return assets(data_dir, say=lambda line: print(line, flush=True))


def cmd_app(args: argparse.Namespace) -> int:
    from app.cli.common import fail
    from app.web.auth import Login, LoginError
    from app.web.throttle import Throttle
    from jobs.settings import Settings

    try:
        login = Login.from_env()  # before anything starts: a plain-text password stops the app here
        throttle = Throttle.from_env()
        settings = Settings.from_env()
    except (LoginError, ValueError) as exc:
        return fail(str(exc))
    _log_to_stderr()
    settings.ensure_dirs()
    if not args.no_worker:
        # same process group as the app: Ctrl-C or a signal to the group stops both; SIGTERM to the app
        # alone exits through atexit, which stops the worker
        worker = subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--loglevel", "WARNING"])
        atexit.register(lambda: _stop(worker))

        def on_term(*_):
            _stop(worker)
            os._exit(0)  # the web server's threads would otherwise keep the process alive

        signal.signal(signal.SIGTERM, on_term)
        print(f"embedded worker started (pid {worker.pid})", flush=True)
    models, texts, evals = bundled_assets(settings.data_dir)
    from app.web import launch

    launch(
        host=args.host,
        port=args.port,
        login=login,
        throttle=throttle,
        default_models=models,
        default_texts=texts,
        eval_texts=evals,
    )
    return 0


def _log_to_stderr() -> None:
    """The server log: the project's own lines (logins, refusals, deletions, failures under their error
    id) from INFO up, one line each with the time; other libraries' from WARNING."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("liar", "jobs", "app"):
        logging.getLogger(name).setLevel(logging.INFO)


def _stop(proc: subprocess.Popen) -> None:
    """Stop the embedded worker (its pool children exit with it)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def register(sub) -> None:
    """Add ``app`` to the ``liar`` subcommands."""
    a = sub.add_parser("app", help="run the web app (with an embedded worker unless --no-worker)")
    a.add_argument("--host", default=os.environ.get("LIAR_APP_HOST", "127.0.0.1"))
    a.add_argument("--port", type=int, default=int(os.environ.get("LIAR_APP_PORT", 7860)))
    a.add_argument("--no-worker", action="store_true", help="do not start a worker (use separate `liar worker`s)")
    a.set_defaults(func=cmd_app)
