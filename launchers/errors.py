"""User-facing errors.

A ``UserError`` is a mistake the user can fix (a bad job.yaml, malformed platform env, a
rank table that does not add up). The CLI prints its message as one paragraph and exits
with code 2 — never a Python traceback. Anything else escaping is a bug in mlaunch.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A mistake in the user's input; ``str(err)`` is the whole message shown to them."""

    exit_code = EXIT_USER_ERROR


class JobFileError(UserError):
    """job.yaml could not be read or does not match the schema."""


class PlatformError(UserError):
    """The platform's env, arguments or rank table are missing, malformed or contradict each other."""
