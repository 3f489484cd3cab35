"""Errors raised while capturing or checking a program, located in the user's source."""
from __future__ import annotations


class CompileError(Exception):
    """A construct gnnfuse cannot compile. The message names the construct and, when the
    error arose while tracing a user function, the file and line that used it."""

    def __init__(self, message: str, source: str | None = None):
        self.message, self.source = message, source
        super().__init__(f"{message}\n  at {source}" if source else message)
