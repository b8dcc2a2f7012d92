"""Who is logged in to the web app, and as what: accounts with hashed passwords, or single sign-on
through a reverse proxy; see ``docs/security.md``.

| variable               | meaning                                                                 |
|------------------------|-------------------------------------------------------------------------|
| ``LIAR_USERS_FILE``    | a file of accounts, one ``name:hash`` or ``name:hash:admin`` per line    |
|                        | (``liar users add NAME`` writes it; ``#`` starts a comment)             |
| ``LIAR_APP_USERS``     | the same entries, comma-separated, in the environment                   |
| ``LIAR_ADMINS``        | more administrators, by name, comma-separated (with either form of login) |
| ``LIAR_AUTH_HEADER``   | single sign-on: the header the proxy puts the user in (``X-Forwarded-User``) |
| ``LIAR_TRUSTED_PROXIES`` | the proxy's addresses or networks (``127.0.0.1,10.0.0.0/8``): the header |
|                        | is believed only from these, every other request is refused (401)        |

Passwords are stored as scrypt hashes (``scrypt$n$r$p$salt$hash``, the standard library's
``hashlib.scrypt``), never in plain text: an entry that is not a hash stops the app at start, with
one sentence saying how to make one (``liar users hash``). With neither form of login, the app is
open (one trusted person or team on a private machine, the default) and everyone may do everything.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.access import OPEN, Actor

SCHEME = "scrypt"
_N, _R, _P = 2**14, 8, 1  # 16 MiB and about 50 ms per check: costly to guess, cheap to log in


class LoginError(ValueError):
    """The login settings are wrong; the message says which and how to fix it, in one sentence."""


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def hash_password(password: str, n: int = _N, r: int = _R, p: int = _P) -> str:
    """A salted scrypt hash of ``password`` as one token (no ``:`` or ``,``: it fits the users file
    and ``LIAR_APP_USERS``)."""
    if not password:
        raise LoginError("a password may not be empty")
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=2**26, dklen=32)
    return f"{SCHEME}${n}${r}${p}${_b64(salt)}${_b64(digest)}"


def is_hash(text: str) -> bool:
    parts = text.split("$")
    return len(parts) == 6 and parts[0] == SCHEME and all(x.isdigit() for x in parts[1:4])


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches the hash ``stored`` (in constant time)."""
    if not is_hash(stored):
        return False
    _, n, r, p, salt, digest = stored.split("$")
    try:
        got = hashlib.scrypt(
            password.encode(), salt=_unb64(salt), n=int(n), r=int(r), p=int(p), maxmem=2**26, dklen=len(_unb64(digest))
        )
    except ValueError:  # parameters no machine can run: no match
        return False
    return hmac.compare_digest(got, _unb64(digest))


@dataclass(frozen=True)
class Account:
    name: str
    password_hash: str
    admin: bool = False


def parse_accounts(entries: list[str], where: str) -> dict[str, Account]:
    """``name:hash[:admin]`` entries as accounts; :class:`LoginError` for a plain-text password, a
    malformed entry or a name given twice."""
    accounts: dict[str, Account] = {}
    for number, entry in enumerate(entries, start=1):
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        name, _, rest = entry.partition(":")
        secret, _, role = rest.partition(":")
        name, role = name.strip(), role.strip().lower()
        if not name or not secret:
            raise LoginError(f"{where}, entry {number}: write name:hash (or name:hash:admin)")
        if not is_hash(secret):
            raise LoginError(
                f"{where} holds a plain-text password for {name!r}: store its hash instead "
                f"(`liar users hash` prints one; `liar users add {name}` writes a users file)"
            )
        if role not in ("", "admin", "user"):
            raise LoginError(f"{where}, entry {number}: the role is 'admin' or nothing, not {role!r}")
        if name in accounts:
            raise LoginError(f"{where} names {name!r} twice")
        accounts[name] = Account(name, secret, role == "admin")
    return accounts


def _networks(text: str) -> tuple[Any, ...]:
    nets = []
    for part in (p.strip() for p in text.split(",")):
        if part:
            try:
                nets.append(ipaddress.ip_network(part, strict=False))
            except ValueError:
                raise LoginError(f"LIAR_TRUSTED_PROXIES: {part!r} is not an address or a network") from None
    return tuple(nets)


@dataclass(frozen=True)
class Login:
    """The app's login: ``mode`` is "open", "passwords" or "proxy"."""

    mode: str = "open"
    accounts: dict[str, Account] = field(default_factory=dict)
    admins: frozenset[str] = frozenset()
    header: str | None = None
    proxies: tuple[Any, ...] = ()

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Login:
        """The login the environment asks for; :class:`LoginError` if it is contradictory or unsafe."""
        env = dict(os.environ if env is None else env)
        entries: list[str] = []
        where = []
        if env.get("LIAR_USERS_FILE"):
            path = Path(env["LIAR_USERS_FILE"]).expanduser()
            if not path.is_file():
                raise LoginError(f"LIAR_USERS_FILE names {path.name!r}, which is not a file")
            entries += path.read_text().splitlines()
            where.append("LIAR_USERS_FILE")
        if env.get("LIAR_APP_USERS"):
            entries += env["LIAR_APP_USERS"].split(",")
            where.append("LIAR_APP_USERS")
        accounts = parse_accounts(entries, " or ".join(where)) if entries else {}
        admins = frozenset(a.strip() for a in env.get("LIAR_ADMINS", "").split(",") if a.strip())
        admins |= {a.name for a in accounts.values() if a.admin}
        header, proxies = env.get("LIAR_AUTH_HEADER", "").strip(), env.get("LIAR_TRUSTED_PROXIES", "").strip()
        if header or proxies:
            if accounts:
                raise LoginError("choose one login: accounts (LIAR_USERS_FILE, LIAR_APP_USERS) or a proxy's header")
            if not (header and proxies):
                raise LoginError("single sign-on needs both LIAR_AUTH_HEADER and LIAR_TRUSTED_PROXIES")
            return cls("proxy", {}, admins, header, _networks(proxies))
        if where and not accounts:
            raise LoginError(f"{' and '.join(where)} holds no account")
        return cls("passwords" if accounts else "open", accounts, admins)

    @property
    def required(self) -> bool:
        return self.mode != "open"

    def check_password(self, name: str, password: str) -> bool:
        """Gradio's ``auth`` callable."""
        account = self.accounts.get(name)
        if account is None:
            verify_password(password, _DUMMY)  # the same time for an unknown name: no user enumeration
            return False
        return verify_password(password, account.password_hash)

    def proxy_user(self, request: Any) -> str | None:
        """Gradio's ``auth_dependency``: the user the trusted proxy names, None (401) for a request that
        did not come through it or carries no user."""
        host = getattr(getattr(request, "client", None), "host", None)
        try:
            address = ipaddress.ip_address(host)
        except (TypeError, ValueError):
            return None
        if not any(address in net for net in self.proxies):
            return None
        user = (request.headers.get(self.header) or "").strip()
        return user or None

    def actor(self, request: Any) -> Actor:
        """Who sent a Gradio request (or a FastAPI one, given its user): :data:`OPEN` without a
        login, else the account, an admin if it is listed as one."""
        return self.named(getattr(request, "username", None) if request is not None else None)

    def named(self, name: str | None) -> Actor:
        """The actor for a user name the app's login established (the download routes)."""
        if not self.required:
            return OPEN
        return Actor(name, admin=name in self.admins) if name else Actor(None, admin=False)


_DUMMY = hash_password("not a password", n=2**14)
