"""Errors users see. `BadInputError` means "you gave me something wrong" and maps to exit code 2.

Every message names the field, what it got and what it expected, so a user can fix the call without
reading a stack trace. `DraftsmithError` covers everything else we can explain (exit code 1).
"""

from __future__ import annotations


class DraftsmithError(Exception):
    """An error we can explain in one sentence (exit code 1)."""

    exit_code = 1


class BadInputError(DraftsmithError, ValueError):
    """Bad user input (exit code 2): names the field, the value it got and what it expected."""

    exit_code = 2

    def __init__(self, field: str, got: object, expected: str, hint: str | None = None):
        self.field, self.got, self.expected, self.hint = field, got, expected, hint
        message = f"{field}: got {got!r}, expected {expected}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)
