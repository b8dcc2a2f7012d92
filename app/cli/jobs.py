"""``liar worker`` and ``liar jobs submit|list|show|cancel``: the job runner from the shell.

liar worker [--gpu 0] [--queues a100-80g,a100-40g]
liar jobs submit RECIPE.yaml [--user NAME] [--ppl FILE] [--tasks piqa,arc_easy]
                 [--sweep-ratios 0.2 0.5 --sweep-methods liar ls]
liar jobs submit --model M --ratio 0.3 --calibration calib.txt [--criterion flap ...]   (the flags of liar prune)
liar jobs list [--status RUNNING] [--deleted]   (--deleted: the tombstones of deleted jobs)
liar jobs show ID [--json]      (the checkpoint's files with size and sha256; seconds per stage and layer)
liar jobs cancel|rerun|delete ID
liar jobs expire [--days N]     (retention now: old jobs' files removed, their records kept)
liar jobs reevaluate ID [--evaluations all|1,3]   (a succeeded job's evaluations again, without pruning)
liar jobs export ID --form gguf-q4_k_m [--form …]  (a succeeded job's checkpoint for serving, without pruning)

Against the database (``LIAR_DATABASE_URL``) as its operator, or with ``--server URL`` (or
``LIAR_SERVER``) against a running app as one of its accounts, under its rules (``app.cli.remote``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from app.cli.common import fail
from app.cli.evaluate import limit_arg
from app.cli.prune import add_recipe_flags, recipe_flags_given, recipe_from_args

SHOWN_FIELDS = (
    "id",
    "status",
    "stage",
    "layer",
    "n_layers",
    "progress",
    "model",
    "ratio",
    "method",
    "criterion",
    "allocation",
    "submitted_by",
    "worker",
    "attempts",
    "created_at",
    "started_at",
    "finished_at",
    "error",
)


def cmd_worker(args: argparse.Namespace) -> int:
    from jobs.worker import run_worker

    try:
        run_worker(gpu=args.gpu, name=args.name, loglevel=args.loglevel, queues=args.queues)
    except ValueError as exc:
        return fail(str(exc))
    return 0


def _service(args: argparse.Namespace | None = None):
    """The job service: a running app's API with ``--server`` (``app.cli.remote``), else the database."""
    server = getattr(args, "server", None)
    if server:
        from app.cli.remote import RemoteJobs

        return RemoteJobs(server)
    from jobs.service import JobService

    return JobService()


def _refusals() -> tuple[type[Exception], ...]:
    """What a command says in one line and exits 2 on: a refusal (of the service, or of a server)."""
    from app.cli.remote import RemoteError
    from jobs.service import NotNow, QueueError, SubmitError

    return (KeyError, PermissionError, SubmitError, NotNow, QueueError, RemoteError)


def _said(exc: Exception) -> int:
    return fail(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))


def _recipe_source(args: argparse.Namespace) -> str | dict:
    """The recipe file as given (the service reads it), or — with flags — the recipe they make."""
    from pydantic import ValidationError

    from core.spec.errors import validation_lines

    if args.recipe and not recipe_flags_given(args):
        return args.recipe
    try:
        return recipe_from_args(args).model_dump(mode="json", exclude_none=True)
    except ValidationError as exc:
        raise ValueError("invalid recipe: " + "; ".join(validation_lines(exc))) from None


def _ppl_seq_len(args: argparse.Namespace, recipe: str | dict) -> int:
    """--ppl-seq-len, else 512 or the model's positions if fewer (a 256-position model gets 256)."""
    if args.ppl_seq_len is not None:
        return args.ppl_seq_len
    from core.pipeline.preflight import default_eval_seq_len
    from core.spec.recipe import Recipe

    try:
        data = recipe if isinstance(recipe, dict) else Recipe.parse_yaml(Path(recipe).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}  # the service says what is wrong with the recipe
    return default_eval_seq_len(data.get("model"))


def cmd_submit(args: argparse.Namespace) -> int:

    try:
        recipe = _recipe_source(args)
    except (ValueError, FileNotFoundError) as exc:
        return fail(str(exc))
    if args.tasks is None and (args.task_dir or args.task_limit or args.num_fewshot is not None):
        return fail("--task-dir, --task-limit and --num-fewshot need --tasks")
    evaluations = []
    if args.ppl:
        evaluations.append({"type": "perplexity", "dataset": args.ppl, "seq_len": _ppl_seq_len(args, recipe)})
    if args.tasks:
        task_options = {"task_dir": args.task_dir, "limit": args.task_limit, "num_fewshot": args.num_fewshot}
        evaluations.append({"type": "lm_eval", "tasks": args.tasks, **task_options})
    user = args.user or os.environ.get("USER")
    sweep = args.sweep_ratios or args.sweep_methods or args.sweep_criteria
    if sweep and args.server:
        return fail("a sweep is submitted on the server (liar jobs submit there) or from the app's form")
    try:
        service = _service(args)
        if sweep:
            group, ids = service.submit_sweep(
                recipe,
                args.sweep_ratios,
                args.sweep_methods,
                args.sweep_criteria,
                submitted_by=user,
                evaluations=evaluations,
            )
            print(json.dumps({"group_id": group, "jobs": ids}) if args.json else f"group {group}: jobs {ids}")
        else:
            job_id = service.submit(recipe, submitted_by=user, evaluations=evaluations)
            print(json.dumps({"id": job_id}) if args.json else job_id)
    except _refusals() as exc:
        return _said(exc)
    return 0


def _asked(row: dict) -> str:
    """The ratio column: the ratio, or a speed target's speed-up (``1.5×``: it has no ratio)."""
    if row.get("ratio") is not None:
        return f"{row['ratio']:g}"
    target = row.get("target")
    return f"{target.get('speedup')}×" if isinstance(target, dict) and target.get("speedup") else "-"


def cmd_list(args: argparse.Namespace) -> int:
    if args.deleted and args.server:
        return fail("--deleted lists the database's tombstones: run it where the database is, without --server")
    filters = {"status": args.status, "group_id": args.group, "submitted_by": args.user, "limit": args.limit}
    try:
        rows = _service(args).list(**filters, **({"deleted": True} if args.deleted else {}))
    except _refusals() as exc:
        return _said(exc)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if args.deleted:
        print(f"{'id':>5}  {'deleted at':<19}  {'deleted by':<10}  {'user':<10}  {'ratio':>5}  model")
        for r in rows:
            at = (r["deleted_at"] or "-")[:19].replace("T", " ")
            print(
                f"{r['id']:>5}  {at:<19}  {(r['deleted_by'] or '-'):<10}  {(r['submitted_by'] or '-'):<10}  "
                f"{_asked(r):>5}  {r['model']}"
            )
        return 0
    print(f"{'id':>5}  {'status':<9}  {'stage':<11}  {'layer':>7}  {'ratio':>5}  {'method':<11}  {'user':<10}  model")
    for r in rows:
        layer = f"{r['layer']}/{r['n_layers']}" if r["n_layers"] else "-"
        print(
            f"{r['id']:>5}  {r['status']:<9}  {(r['stage'] or '-'):<11}  {layer:>7}  {_asked(r):>5}  "
            f"{r['method'] or '-':<11}  {(r['submitted_by'] or '-'):<10}  {r['model']}"
        )
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    try:
        info = _service(args).show(args.id, internal=True)  # the operator's view: paths and traceback
    except _refusals() as exc:
        return _said(exc)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for key in SHOWN_FIELDS:
        print(f"{key:>13}: {info[key]}")
    if info["status"] == "DELETED":  # a tombstone (jobs.tombstones): its files are gone
        print(f"{'deleted':>13}: {info['deleted_at']} by {info['deleted_by'] or '-'}")
    if info.get("target") is not None:  # a speed target in place of the ratio
        print(f"{'target':>13}: {_asked(info)} ({info['target'].get('workload', 'decode_b1')})")
    if info.get("queue"):  # routed by memory (LIAR_QUEUES, jobs.routing)
        print(f"{'queue':>13}: {info['queue']}")
    if info.get("source_job"):  # a re-evaluation (jobs.reevaluation)
        print(f"{'re-evaluates':>13}: job {info['source_job']} (its evaluations on that job's checkpoint)")
    for name, value in sorted(info["metrics"].items()):
        print(f"{'metric':>13}: {name} = {value:g}")
    _print_artifacts(info["artifacts"])
    _print_timings(info.get("timings"))
    _print_attempts(info.get("log") or [])
    return 0


def _print_attempts(log: list[dict]) -> None:
    """Each attempt's worker, blocks and minutes (where a job resumed, the time its lost run cost)."""
    from jobs.checkpoints import attempts

    for a in attempts(log):
        of = f" of {a['blocks']}" if a["blocks"] else ""
        kept = f", checkpoint after block {a['saved_block']}{of}" if a["saved_block"] else ""
        print(
            f"{'attempt':>13}: {a['attempt']} on {a['worker']}: from block {a['from_block']}{of}{kept}, "
            f"{a['minutes']:.1f} min"
        )


def _print_artifacts(artifacts: list[dict]) -> None:
    """The checkpoint folder, then each file with its size and sha256 (check a copy with
    ``sha256sum -c SHA256SUMS``); an older job's .tar.gz as it was recorded."""
    files = [a for a in artifacts if a["kind"] == "file"]
    for a in artifacts:
        if a["kind"] == "checkpoint":
            count = f" in {len(files)} files" if files else ""
            where = f"{a['path']} " if a.get("path") else ""  # a server shows names, not its folders
            print(f"{'checkpoint':>13}: {where}({a['size']:,} bytes{count})")
        elif a["kind"] != "file":
            print(f"{a['kind']:>13}: {a.get('path') or a['name']} ({a['size']:,} bytes, sha256 {a['sha256'] or '-'})")
    width = max((len(a["name"] or "") for a in files), default=0)
    for a in files:
        print(f"{'file':>13}: {a['name']:<{width}}  {a['size']:>15,}  {a['sha256'] or '-'}")


def _print_timings(timings: dict | None) -> None:
    """Where the time went: seconds per stage, per reconstructed layer and evaluation, the total."""
    from jobs.timings import rows

    table = rows(timings)
    if not table:
        return
    total = timings.get("total") or 0.0
    print(f"{'timings':>13}: {'stage':<24} {'seconds':>9}  share")
    for label, seconds in table:
        share = "" if label.startswith(" ") or label == "total" or not total else f"{100 * seconds / total:4.0f}%"
        print(f"{'':>13}  {label:<24} {seconds:>9.1f}  {share}")


def cmd_cancel(args: argparse.Namespace) -> int:
    try:
        status = _service(args).cancel(args.id)
    except _refusals() as exc:
        return _said(exc)
    print(f"job {args.id}: {status if status != 'RUNNING' else 'cancel requested (stops at the next layer)'}")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    try:
        _service(args).delete(args.id)
    except _refusals() as exc:
        return _said(exc)
    print(f"job {args.id}: deleted, with its files")
    return 0


def cmd_expire(args: argparse.Namespace) -> int:
    """Retention now, as the workers' maintenance applies it every ten minutes (``LIAR_RETENTION_DAYS``)."""
    if args.days is not None and not args.days > 0:
        return fail(f"--days is a positive number of days, not {args.days:g}")
    service = _service()
    if args.days is None and not service.settings.retention_days:
        return fail("no retention is set: give --days N, or set LIAR_RETENTION_DAYS")
    expired = service.expire(args.days)
    days = args.days or service.settings.retention_days
    listed = f": job {', '.join(map(str, expired))}" if expired else ""
    jobs, unit = ("job" if len(expired) == 1 else "jobs"), ("day" if days == 1 else "days")
    print(f"files removed of {len(expired)} {jobs} finished more than {days:g} {unit} ago{listed}")
    return 0


def cmd_rerun(args: argparse.Namespace) -> int:
    try:
        new = _service(args).rerun(args.id, confine=False)  # a server confines it anyway; the operator need not
    except _refusals() as exc:
        return _said(exc)
    print(f"job {args.id}: re-submitted as job {new}")
    return 0


def cmd_reevaluate(args: argparse.Namespace) -> int:
    try:  # the operator reads what the job read; a server confines the data as a web submission's
        new = _service(args).reevaluate(args.id, evaluations=args.evaluations, confine=False)
    except _refusals() as exc:
        return _said(exc)
    print(f"job {args.id}: evaluations run again on its checkpoint as job {new} (nothing is pruned)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    try:
        new = _service(args).export(args.id, args.form)
    except _refusals() as exc:
        return _said(exc)
    print(f"job {args.id}: its checkpoint exported as {', '.join(args.form)} by job {new} (nothing is pruned)")
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from jobs.db import SchemaError, upgrade
    from jobs.settings import Settings

    settings = Settings.from_env()
    settings.ensure_dirs()
    try:
        revision = upgrade(settings.database_url)
    except SchemaError as exc:
        return fail(str(exc))
    except Exception as exc:  # unreachable server, bad URL: one line, not a traceback
        return fail(
            f"could not upgrade the database {settings.database_url.split('@')[-1]}: {type(exc).__name__}: {exc}"
        )
    print(f"database schema at revision {revision}")
    return 0


def _checkpoint_verbs(jsub) -> tuple:
    """``liar jobs reevaluate`` and ``liar jobs export``: a succeeded job's checkpoint used again."""
    e = jsub.add_parser("reevaluate", help="run a succeeded job's evaluations again on its checkpoint, without pruning")
    e.add_argument("id", type=int)
    e.add_argument(
        "--evaluations",
        help="'all', or numbers as the job's log gives them (1,3); default: the ones that failed (all if none did)",
    )
    e.set_defaults(func=cmd_reevaluate)
    ex = jsub.add_parser("export", help="write a succeeded job's checkpoint in a serving form, without pruning")
    ex.add_argument("id", type=int)
    ex.add_argument(
        "--form",
        action="append",
        required=True,
        help="a serving form (repeat for several): gguf-f16, gguf-q8_0, gguf-q5_k_m, gguf-q4_k_m, gguf-q3_k_m, "
        "gguf-iq3_xxs, gguf-iq2_m or vllm",
    )
    ex.set_defaults(func=cmd_export)
    return e, ex


def register(sub) -> None:
    """Add ``worker``, ``jobs`` and ``db`` (with their subcommands) to the ``liar`` subcommands."""
    d = sub.add_parser("db", help="the jobs database")
    dsub = d.add_subparsers(dest="db_command", required=True)
    up = dsub.add_parser("upgrade", help="bring the schema to this code's revision (once, before the app and workers)")
    up.set_defaults(func=cmd_db_upgrade)

    w = sub.add_parser("worker", help="run a job worker (one job at a time, fresh process per job)")
    w.add_argument("--gpu", help="GPU index for this worker (sets CUDA_VISIBLE_DEVICES)")
    w.add_argument("--name", help="worker name (default liar-gpuN-PID@host)")
    w.add_argument(
        "--queues",
        help="comma-separated queues of LIAR_QUEUES this worker serves (default $LIAR_WORKER_QUEUES, else liar)",
    )
    w.add_argument("--loglevel", default="INFO")
    w.set_defaults(func=cmd_worker)

    j = sub.add_parser("jobs", help="submit, list, show and cancel pruning jobs")
    jsub = j.add_subparsers(dest="jobs_command", required=True)
    s = jsub.add_parser("submit", help="queue a recipe; prints the job id")
    add_recipe_flags(s)
    s.add_argument("--user", help="submitted-by name (default $USER)")
    s.add_argument("--ppl", help="evaluate perplexity on this named set or text file after pruning")
    s.add_argument(
        "--ppl-seq-len", type=int, help="tokens per evaluation window (default: 512, or the model's positions if fewer)"
    )
    s.add_argument(
        "--tasks",
        help="also run these lm-eval tasks after pruning (comma-separated; block by block for a streamed run)",
    )
    s.add_argument("--task-dir", help="directory of local task YAMLs for --tasks")
    s.add_argument("--task-limit", type=limit_arg, help="examples per task: a count, or a fraction below 1")
    s.add_argument("--num-fewshot", type=int, help="few-shot examples per prompt (default: the task's, else 0)")
    s.add_argument("--sweep-ratios", type=float, nargs="+")
    s.add_argument("--sweep-methods", nargs="+")
    s.add_argument("--sweep-criteria", nargs="+")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_submit)
    ls = jsub.add_parser("list", help="recent jobs")
    ls.add_argument("--status")
    ls.add_argument("--group")
    ls.add_argument("--user")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--deleted", action="store_true", help="the deleted jobs' tombstones: who deleted each, when")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)
    sh = jsub.add_parser("show", help="one job: status, metrics, files (size, sha256), seconds per stage")
    sh.add_argument("id", type=int)
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=cmd_show)
    c = jsub.add_parser("cancel", help="cancel a queued or running job")
    c.add_argument("id", type=int)
    c.set_defaults(func=cmd_cancel)
    d = jsub.add_parser("delete", help="delete a finished job and its files")
    d.add_argument("id", type=int)
    d.set_defaults(func=cmd_delete)
    x = jsub.add_parser("expire", help="remove the files of jobs finished long ago (their records stay)")
    x.add_argument("--days", type=float, help="older than this many days (default: LIAR_RETENTION_DAYS)")
    x.set_defaults(func=cmd_expire)
    r = jsub.add_parser("rerun", help="submit a job's recipe again, as a new job")
    r.add_argument("id", type=int)
    r.set_defaults(func=cmd_rerun)
    e, ex = _checkpoint_verbs(jsub)
    for verb in (s, ls, sh, c, d, r, e, ex):
        verb.add_argument(
            "--server",
            default=os.environ.get("LIAR_SERVER"),
            help="a running app's address: act as an account of it (LIAR_SERVER_USER, LIAR_SERVER_PASSWORD)",
        )
