"""Exceptions raised by tecomp.

Every error a user can provoke is one of these (or a plain TypeError/ValueError/IndexError for
argument problems), with a message that names the offending stage, axis, tensor or argument.
"""

from __future__ import annotations


class TecompError(Exception):
    """Base class of every tecomp-specific error."""


class ScheduleError(TecompError):
    """A schedule primitive that cannot be honoured (names the stage and the axis)."""


class LoweringError(TecompError):
    """The schedule or compute declaration cannot be turned into a loop nest."""


class CodegenError(TecompError):
    """LLVM code generation failed (a construct the backend does not support)."""
