"""Who may use the admin API, and how much (CONTRACTS sections 1 and 6): named operators, each with a role,
from PIN_IDENTITY_ADMIN_TOKENS_FILE and PIN_IDENTITY_ADMIN_TOKEN (one operator, `admin`, role `operator`).

The file holds one operator per line, `<name> <role> <sha256 of the token, hex>`; blank lines and `#` comments
are ignored. It is read again when a request or `/readyz` asks and RECHECK_S has passed since the last look,
so an edit (a token added, rotated or removed) is in force within seconds, without a restart. A file that
cannot be read or parsed leaves the operators as they were: one log line (`admin-operators-file-invalid`)
says why, and `/readyz` names it until the file is fixed. Only digests are kept; a presented token is hashed
and compared with every operator's digest in constant time.
"""

from __future__ import annotations

import hmac
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path

from pin_identity.config import ConfigurationError, Settings
from pin_identity.entrypoints.documents import AdminRole
from pin_identity.observability.logging import get_logger

log = get_logger("admin-http")

TOKENS_FILE = "PIN_IDENTITY_ADMIN_TOKENS_FILE"
TOKEN_VARIABLE = "PIN_IDENTITY_ADMIN_TOKEN"  # noqa: S105 - a variable's name
SINGLE_OPERATOR = "admin"  # the name PIN_IDENTITY_ADMIN_TOKEN's holder has in audit lines
RECHECK_S = 2.0
MAX_FILE_BYTES = 1024 * 1024  # a path mistakenly naming a device or a log must not be read whole
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
_EMPTY_TOKEN = sha256(b"").digest()


@dataclass(frozen=True)
class Operator:
    name: str
    role: AdminRole
    digest: bytes = field(repr=False)  # sha256 of the token


class OperatorsFileError(ValueError):
    """The tokens file cannot be read or parsed; the message names the line, never a token or digest."""


def token_digest(token: str) -> bytes:
    """White space around a token is not part of it: a secret written with a trailing newline still works."""
    return sha256(token.strip().encode()).digest()


def parse_operators(text: str, beside: Iterable[Operator] = ()) -> tuple[Operator, ...]:
    """The operators a file lists. Names and tokens are unique, also against `beside` (the operator of
    PIN_IDENTITY_ADMIN_TOKEN): an audit line must name one person, and a token must belong to one."""
    names = {operator.name: TOKEN_VARIABLE for operator in beside}
    digests = {operator.digest: TOKEN_VARIABLE for operator in beside}
    listed = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
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


def _read(path: Path) -> str:
    try:
        with path.open("rb") as opened:
            content = opened.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise OperatorsFileError(f"cannot read {path} ({exc.strerror or type(exc).__name__})") from None
    if len(content) > MAX_FILE_BYTES:
        raise OperatorsFileError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        raise OperatorsFileError(f"{path} is not UTF-8 text") from None


class Operators:
    """The operators in force: PIN_IDENTITY_ADMIN_TOKEN's, and the tokens file's as last read successfully."""

    def __init__(
        self,
        token: str | None,
        tokens_file: Path | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        recheck_s: float = RECHECK_S,
    ):
        self._fixed = (
            (Operator(SINGLE_OPERATOR, AdminRole.OPERATOR, token_digest(token)),)
            if token and token.strip()
            else ()
        )
        if not self._fixed and tokens_file is None:
            raise ConfigurationError(f"{TOKENS_FILE} or {TOKEN_VARIABLE}: required by serve")
        self._file, self._clock, self._recheck_s = tokens_file, clock, recheck_s
        self._lock = threading.Lock()
        self._listed: tuple[Operator, ...] = ()
        self._text: str | None = None  # the file's content in force
        self._problem: str | None = None
        self._looked_at = clock()
        if tokens_file is not None:
            try:
                self._adopt(_read(tokens_file))
            except OperatorsFileError as exc:  # at start there is nothing to fall back on
                raise ConfigurationError(f"{TOKENS_FILE}: {exc}") from None

    @classmethod
    def from_settings(cls, settings: Settings) -> Operators:
        return cls(settings.admin_token, settings.admin_tokens_file)

    def authenticate(self, token: str) -> Operator | None:
        """The operator whose token this is, or None. Every operator's digest is compared, each in constant
        time, so the answer's timing tells nothing about which one was nearly right."""
        presented = token_digest(token)
        found = None
        for operator in self.current():
            if hmac.compare_digest(presented, operator.digest):
                found = operator
        return found

    def current(self) -> tuple[Operator, ...]:
        self._look_again()
        return self._fixed + self._listed

    def problem(self) -> str | None:
        """Why the tokens file as it is now is not in force; None when it is."""
        self._look_again()
        return self._problem

    def _look_again(self) -> None:
        if self._file is None:
            return
        with self._lock:
            now = self._clock()
            if now - self._looked_at < self._recheck_s:
                return
            self._looked_at = now
            try:
                text = _read(self._file)
                if text != self._text or self._problem is not None:
                    self._adopt(text)
                    log.info("admin-operators-reloaded", **self.counts())
            except OperatorsFileError as exc:
                self._refuse(str(exc))

    def _adopt(self, text: str) -> None:
        if text != self._text:
            self._listed = parse_operators(text, beside=self._fixed)
            self._text = text
        self._problem = None

    def _refuse(self, reason: str) -> None:
        problem = f"{TOKENS_FILE}: {reason}; the operators read before stay in force"
        if problem != self._problem:  # one line per new problem, not one per look
            log.warning("admin-operators-file-invalid", reason=reason, **self.counts())
        self._problem = problem

    def counts(self) -> dict[str, int]:
        """How many operators of each role are in force (`viewers`, `operators`), for the log."""
        operators = self._fixed + self._listed
        return {role.value + "s": sum(o.role is role for o in operators) for role in AdminRole}
