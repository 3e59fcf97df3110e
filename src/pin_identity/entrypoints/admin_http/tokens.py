"""Who may use the admin API, and how much (CONTRACTS sections 1 and 6): named operators, each with a role,
from PIN_IDENTITY_ADMIN_TOKENS_FILE and PIN_IDENTITY_ADMIN_TOKEN (one operator, `admin`, role `operator`).

The file holds one operator per line, `<name> <role> <sha256 of the token, hex>`; blank lines and `#` comments
are ignored, and so is a UTF-8 byte-order mark. It is read again when a request, `/readyz` or `/metrics` asks
and RECHECK_S has passed since the last look, so an edit (a token added, rotated or removed) is in force
within seconds, without a restart. Each look reads the file on a thread of its own, never under a lock and
never on the event loop: the request that started it waits for it at most LOOK_TIMEOUT_S (off the loop), and
a look that takes longer (a hung network mount) is given up on: the operators last loaded stay in force, one
line (`admin-operators-file-unanswered`) and `/readyz` say so, and no other look starts until it returns.
A file that cannot be used fails closed: one that does not parse keeps, of the operators of the last file that
loaded, only those whose line is still there unchanged (an edit that removes an operator and has a typo
elsewhere still removes that operator); one that cannot be read (gone missing) keeps none of them.
PIN_IDENTITY_ADMIN_TOKEN's operator is not the file's and stays. One log line (`admin-operators-file-invalid`)
says why, `/readyz` names it and `identity_admin_tokens_file_load_error` is 1 until the file is fixed. A file
that others than its owner may read is warned about (`admin-operators-file-readable`). Only digests are kept,
and no log line carries a token or a digest; a presented token is hashed and compared with every operator's
digest in constant time.
"""

from __future__ import annotations

import hmac
import os
import re
import stat
import threading
from collections.abc import Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path

import anyio

from pin_identity.config import ConfigurationError, Settings
from pin_identity.domain.clock import Clock
from pin_identity.entrypoints.documents import AdminRole
from pin_identity.observability import metrics
from pin_identity.observability.logging import get_logger

log = get_logger("admin-http")

TOKENS_FILE = "PIN_IDENTITY_ADMIN_TOKENS_FILE"
TOKEN_VARIABLE = "PIN_IDENTITY_ADMIN_TOKEN"  # noqa: S105 - a variable's name
SINGLE_OPERATOR = "admin"  # the name PIN_IDENTITY_ADMIN_TOKEN's holder has in audit lines
RECHECK_S = 2.0
LOOK_TIMEOUT_S = 1.0  # a healthy read takes well under a millisecond
MAX_FILE_BYTES = 1024 * 1024  # a path mistakenly naming a device or a log must not be read whole
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
_EMPTY_TOKEN = sha256(b"").digest()
ONLY_UNCHANGED = "only the operators whose line is unchanged stay in force"
NONE_OF_THEM = "none of its operators is in force"


@dataclass(frozen=True)
class Operator:
    name: str
    role: AdminRole
    digest: bytes = field(repr=False)  # sha256 of the token


class OperatorsFileError(ValueError):
    """The tokens file cannot be used (parsed, or with the subclass read); the message names the line, never a
    token or digest."""


class OperatorsFileUnreadableError(OperatorsFileError):
    """The tokens file cannot be read at all (missing, unreadable, too large): no line of it is known."""


def token_digest(token: str) -> bytes:
    """White space around a token is not part of it: a secret written with a trailing newline still works."""
    return sha256(token.strip().encode()).digest()


def parse_operators(text: str, beside: Iterable[Operator] = ()) -> tuple[Operator, ...]:
    """The operators a file lists. Names and tokens are unique, also against `beside` (the operator of
    PIN_IDENTITY_ADMIN_TOKEN): an audit line must name one person, and a token must belong to one."""
    names = {operator.name: TOKEN_VARIABLE for operator in beside}
    digests = {operator.digest: TOKEN_VARIABLE for operator in beside}
    listed = []
    for number, line in _lines(text):
        operator = _operator(number, line)
        if operator.name in names:
            raise OperatorsFileError(
                f"line {number}: operator {operator.name!r} is also {names[operator.name]}"
            )
        if operator.digest in digests:
            raise OperatorsFileError(f"line {number}: the same token as {digests[operator.digest]}")
        names[operator.name] = digests[operator.digest] = f"line {number}"
        listed.append(operator)
    return tuple(listed)


def unchanged_operators(text: str, loaded: Iterable[Operator]) -> tuple[Operator, ...]:
    """Of the operators `loaded` from the last file that parsed, those whose line `text` still has as it was
    (the same name, role and digest), whatever its other lines say."""
    present = set()
    for number, line in _lines(text):
        with suppress(OperatorsFileError):
            present.add(_operator(number, line))
    return tuple(operator for operator in loaded if operator in present)


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """The lines that say something, numbered as an editor numbers them, without comments or white space."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            yield number, line


def _operator(number: int, line: str) -> Operator:
    fields = line.split()
    if len(fields) != 3:  # name, role, digest
        raise OperatorsFileError(
            f"line {number}: {len(fields)} fields, expected 3: <name> <role> <sha256 of the token>"
        )
    name, role, digest = fields
    if not _NAME.fullmatch(name):
        raise OperatorsFileError(
            f"line {number}: a name is 1 to 64 letters, digits, '.', '_' or '-' (first a letter or digit)"
        )
    if role not in {known.value for known in AdminRole}:
        raise OperatorsFileError(f"line {number}: unknown role {role!r} (viewer or operator)")
    if not _SHA256_HEX.fullmatch(digest):
        raise OperatorsFileError(f"line {number}: the third field is not a sha256 (64 hex digits)")
    if bytes.fromhex(digest) == _EMPTY_TOKEN:
        raise OperatorsFileError(f"line {number}: that is the sha256 of an empty token")
    return Operator(name, AdminRole(role), bytes.fromhex(digest))


def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as opened:
            content = opened.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise OperatorsFileUnreadableError(
            f"cannot read {path} ({exc.strerror or type(exc).__name__})"
        ) from None
    if len(content) > MAX_FILE_BYTES:
        raise OperatorsFileUnreadableError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
    return content


def _text(path: Path, content: bytes) -> str:
    """The file as text; a byte-order mark (as some editors write) is not part of its first line."""
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise OperatorsFileError(f"{path} is not UTF-8 text") from None


def readers_besides_the_owner(mode: int, *, owner: int, reader: int) -> str | None:
    """Who else may read a file of this mode and owner, read by the process of uid `reader`: "group",
    "others", "group and others", or None. PostgreSQL's rule for its key file: a group may read a file root
    owns (a mounted Kubernetes Secret, whose group is the pod's fsGroup: someone put the reader in it on
    purpose), never the reader's own file; others never may."""
    group = bool(mode & stat.S_IRGRP) and not (owner == 0 and reader != 0)
    others = bool(mode & stat.S_IROTH)
    return " and ".join(who for who, may in (("group", group), ("others", others)) if may) or None


@dataclass(frozen=True)
class _Look:
    """One look at the file, on a thread of its own: done once it has read (or failed to read) the file."""

    started: float  # on the clock's monotonic time
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class _Found:
    """What a look found: the file's mode and owner (None when it could not be stat'ed), and its content or
    why it could not be read."""

    status: os.stat_result | None
    content: bytes | None
    unreadable: OperatorsFileUnreadableError | None


def _look_at(path: Path) -> _Found:
    """The file as it is now: the only place that touches it after start, always on a look's thread."""
    try:
        status: os.stat_result | None = path.stat()
    except OSError:
        status = None  # reading it will say why
    try:
        return _Found(status, _read(path), None)
    except OperatorsFileUnreadableError as exc:
        return _Found(status, None, exc)


class Operators:
    """The operators in force: PIN_IDENTITY_ADMIN_TOKEN's, and those of the tokens file as it is now (when it
    cannot be used: those of the last file that loaded whose line is still there unchanged; while a look at
    it does not answer: those last in force)."""

    def __init__(
        self,
        token: str | None,
        tokens_file: Path | None,
        *,
        clock: Clock,
        recheck_s: float = RECHECK_S,
        look_timeout_s: float = LOOK_TIMEOUT_S,
    ):
        self._fixed = (
            (Operator(SINGLE_OPERATOR, AdminRole.OPERATOR, token_digest(token)),)
            if token and token.strip()
            else ()
        )
        if not self._fixed and tokens_file is None:
            raise ConfigurationError(f"{TOKENS_FILE} or {TOKEN_VARIABLE}: required by serve")
        self._file, self._clock = tokens_file, clock
        self._recheck_s, self._look_timeout_s = recheck_s, look_timeout_s
        # Guards the fields below; held only to read or swap them, never across I/O.
        self._lock = threading.Lock()
        self._loaded: tuple[Operator, ...] = ()  # the operators of the last file that loaded whole
        self._listed: tuple[Operator, ...] = ()  # the file's operators in force
        self._content: bytes | None = None  # the file as last read; None when it could not be
        self._problem: str | None = None
        self._readable: tuple[str, int] | None = None  # who else may read it, and its mode, as warned
        self._look: _Look | None = None  # the last look started
        self._unanswered: _Look | None = None  # a look given up on, said once
        self._looked_at = clock.monotonic()
        if tokens_file is not None:
            found = _look_at(tokens_file)  # at start, before any request: there is nothing to fall back on
            self._check_readers(tokens_file, found.status)
            try:
                if found.unreadable is not None:
                    raise found.unreadable
                self._adopt(found.content or b"", tokens_file)
            except OperatorsFileError as exc:
                raise ConfigurationError(f"{TOKENS_FILE}: {exc}") from None
            metrics.admin_tokens_file_load_error.set(0)

    @classmethod
    def from_settings(cls, settings: Settings, clock: Clock) -> Operators:
        return cls(settings.admin_token, settings.admin_tokens_file, clock=clock)

    def authenticate(self, token: str) -> Operator | None:
        """The operator whose token this is, or None (from a thread: it may wait for a look under way)."""
        return _matching(token, self.current())

    async def authenticate_waiting(self, token: str) -> Operator | None:
        """`authenticate` for the event loop: a look under way is waited for off the loop, at most until its
        timeout; the loop itself never touches the file."""
        look = self._due_look()
        if look is not None and (left := self._left(look)) > 0:
            await anyio.to_thread.run_sync(look.done.wait, left)
        return _matching(token, self._in_force())

    def current(self) -> tuple[Operator, ...]:
        self._wait(self._due_look())
        return self._in_force()

    def problem(self) -> str | None:
        """Why the tokens file as it is now is not in force; None when it is."""
        self._wait(self._due_look())
        with self._lock:
            self._say_unanswered()
            return self._problem

    def _in_force(self) -> tuple[Operator, ...]:
        with self._lock:
            self._say_unanswered()
            return self._fixed + self._listed

    def _left(self, look: _Look) -> float:
        return look.started + self._look_timeout_s - self._clock.monotonic()

    def _wait(self, look: _Look | None) -> None:
        """From a thread: a look under way, at most until its timeout."""
        if look is not None and (left := self._left(look)) > 0:
            look.done.wait(left)

    def _due_look(self) -> _Look | None:
        """The look under way, started now when RECHECK_S has passed and none is under way (a look that does
        not return holds every later one back: no thread piles up behind a hung mount)."""
        if self._file is None:
            return None
        with self._lock:
            if self._look is not None and not self._look.done.is_set():
                return self._look
            now = self._clock.monotonic()
            if now - self._looked_at < self._recheck_s:
                return None
            self._looked_at = now
            look = self._look = _Look(started=now)
        threading.Thread(
            target=self._run, args=(self._file, look), name="admin-tokens-file", daemon=True
        ).start()
        return look

    def _run(self, path: Path, look: _Look) -> None:
        try:
            found = _look_at(path)
            with self._lock:
                if self._unanswered is look:  # what it found is judged afresh, whatever was read before
                    self._unanswered, self._content = None, None
                    took_s = round(self._clock.monotonic() - look.started, 1)
                    log.info("admin-operators-file-answered", took_s=took_s)
                self._check_readers(path, found.status)
                self._reload(path, found)
        finally:
            look.done.set()

    def _say_unanswered(self) -> None:
        """A look past its timeout: the operators in force stay, the file is said not to answer (once)."""
        look = self._look
        if look is None or look.done.is_set() or self._left(look) > 0 or self._unanswered is look:
            return
        self._unanswered = look
        reason = f"{self._file} did not answer within {self._look_timeout_s:g} s (a hung mount?)"
        metrics.admin_tokens_file_load_error.set(1)
        self._problem = f"{TOKENS_FILE}: {reason}; the operators last loaded stay in force"
        log.warning("admin-operators-file-unanswered", reason=reason, **self.counts())

    def _reload(self, path: Path, found: _Found) -> None:
        if found.unreadable is not None:
            self._content = None
            self._fall_back((), str(found.unreadable), NONE_OF_THEM)
            return
        content = found.content or b""
        if content == self._content:
            return  # as it was at the last look, in force or not
        try:
            self._adopt(content, path)
        except OperatorsFileError as exc:
            self._content = content
            kept = unchanged_operators(content.decode("utf-8-sig", errors="replace"), self._loaded)
            self._fall_back(kept, str(exc), ONLY_UNCHANGED)
            return
        metrics.admin_tokens_file_load_error.set(0)
        log.info("admin-operators-reloaded", **self.counts())

    def _adopt(self, content: bytes, path: Path) -> None:
        self._loaded = self._listed = parse_operators(_text(path, content), beside=self._fixed)
        self._content = content
        self._problem = None

    def _fall_back(self, kept: tuple[Operator, ...], reason: str, consequence: str) -> None:
        self._listed = kept
        metrics.admin_tokens_file_load_error.set(1)
        problem = f"{TOKENS_FILE}: {reason}; {consequence}"
        if problem != self._problem:  # one line per new problem, not one per look
            log.warning("admin-operators-file-invalid", reason=reason, **self.counts())
        self._problem = problem

    def _check_readers(self, path: Path, status: os.stat_result | None) -> None:
        """A warning when others than the owner may read the file, once for each mode that lets them."""
        if status is None:
            return  # reading it will say why
        readers = readers_besides_the_owner(status.st_mode, owner=status.st_uid, reader=os.geteuid())
        finding = (readers, stat.S_IMODE(status.st_mode)) if readers else None
        if finding is not None and finding != self._readable:
            mode = f"{finding[1]:04o}"
            log.warning("admin-operators-file-readable", path=str(path), mode=mode, readable_by=readers)
        self._readable = finding

    def counts(self) -> dict[str, int]:
        """How many operators of each role are in force (`viewers`, `operators`), for the log."""
        operators = self._fixed + self._listed
        return {role.value + "s": sum(o.role is role for o in operators) for role in AdminRole}


def _matching(token: str, operators: tuple[Operator, ...]) -> Operator | None:
    """The operator whose token this is, or None. Every operator's digest is compared, each in constant time,
    so the answer's timing tells nothing about which one was nearly right."""
    presented = token_digest(token)
    found = None
    for operator in operators:
        if hmac.compare_digest(presented, operator.digest):
            found = operator
    return found
