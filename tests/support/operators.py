"""Tokens files (PIN_IDENTITY_ADMIN_TOKENS_FILE) for tests: named operators with their roles."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def write_tokens_file(path: Path, operators: dict[str, tuple[str, str]]) -> Path:
    """`operators`: name -> (role, token). Replaced whole (a new file renamed over the old one), as a mounted
    Kubernetes secret changes: a reader never sees half of it."""
    lines = ["# name role sha256-of-the-token"]
    lines += [
        f"{name} {role} {hashlib.sha256(token.encode()).hexdigest()}"
        for name, (role, token) in operators.items()
    ]
    fresh = path.with_name(path.name + ".new")
    fresh.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fresh.chmod(0o600)  # as docs/operators.md asks: nobody else reads the digests
    os.replace(fresh, path)
    return path
