"""The analysis's one error type, apart from the reader (:mod:`~trainer_core.analysis.load`) so
the fitters need not import it."""

from __future__ import annotations

from trainer_core.errors import UserError


class AnalysisError(UserError, ValueError):
    """An experiment dir or its files can't be analysed; the message names the path and the fix."""
