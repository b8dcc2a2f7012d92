"""``liar users``: the web app's accounts, as password hashes (``app.web.auth``).

    liar users add alice --admin --file /etc/liar/users    asks for the password twice, writes the line
    liar users hash                                        prints a hash, for LIAR_APP_USERS
    liar users remove bob --file /etc/liar/users

The password is read without echo from the terminal, or as one line from standard input when it is
not a terminal (``printf '%s\\n' "$PW" | liar users add ci-bot --file F``). The file is rewritten
whole (a temporary file renamed over it, readable by its owner only).
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from app.cli.common import fail


def _password() -> str:
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\n")
    first = getpass.getpass("password: ")
    if first != getpass.getpass("again: "):
        raise ValueError("the two passwords differ")
    return first


def _users_file(args: argparse.Namespace) -> Path:
    name = args.file or os.environ.get("LIAR_USERS_FILE")
    if not name:
        raise ValueError("name the users file: --file PATH, or set LIAR_USERS_FILE")
    return Path(name).expanduser()


def _write(path: Path, lines: list[str]) -> None:
    """``lines`` as the users file: written beside it, then renamed over it (owner-only permissions)."""
    from app.web.auth import parse_accounts

    parse_accounts(lines, str(path))  # never write a file the app would refuse
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{line}\n" for line in lines))
    os.replace(tmp, path)


def _others(path: Path, name: str) -> list[str]:
    """The file's lines that are not ``name``'s account."""
    lines = path.read_text().splitlines() if path.is_file() else []
    return [line for line in lines if line.split(":", 1)[0].strip() != name]


def cmd_hash(args: argparse.Namespace) -> int:
    from app.web.auth import LoginError, hash_password

    try:
        print(hash_password(_password()))
    except (ValueError, LoginError) as exc:
        return fail(str(exc))
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    from app.web.auth import LoginError, hash_password

    if not args.name or any(c in args.name for c in ":,#") or args.name != args.name.strip():
        return fail(f"a user name may not be empty or hold ':', ',', '#' or surrounding spaces: {args.name!r}")
    try:
        path = _users_file(args)
        line = f"{args.name}:{hash_password(_password())}" + (":admin" if args.admin else "")
        existed = path.is_file() and len(_others(path, args.name)) < len(path.read_text().splitlines())
        _write(path, [*_others(path, args.name), line])
    except (ValueError, LoginError, OSError) as exc:
        return fail(str(exc))
    print(f"{'updated' if existed else 'added'} {args.name}{' (admin)' if args.admin else ''} in {path}")
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    try:
        path = _users_file(args)
        if not path.is_file():
            return fail(f"{path} does not exist")
        others = _others(path, args.name)
        if len(others) == len(path.read_text().splitlines()):
            return fail(f"{path} has no user {args.name!r}")
        _write(path, others)
    except (ValueError, OSError) as exc:
        return fail(str(exc))
    print(f"removed {args.name} from {path}")
    return 0


def register(sub) -> None:
    """Add ``users`` to the ``liar`` subcommands."""
    u = sub.add_parser("users", help="the web app's accounts (password hashes)")
    usub = u.add_subparsers(dest="users_command", required=True)
    h = usub.add_parser("hash", help="print the hash of a password (for LIAR_APP_USERS)")
    h.set_defaults(func=cmd_hash)
    a = usub.add_parser("add", help="add or update an account in the users file")
    a.add_argument("name")
    a.add_argument("--admin", action="store_true", help="may cancel, re-run and delete anyone's jobs")
    a.add_argument("--file", help="the users file (default: $LIAR_USERS_FILE)")
    a.set_defaults(func=cmd_add)
    r = usub.add_parser("remove", help="remove an account from the users file")
    r.add_argument("name")
    r.add_argument("--file", help="the users file (default: $LIAR_USERS_FILE)")
    r.set_defaults(func=cmd_remove)
