"""How analysis results show in a notebook: as the text ``print`` gives.

IPython and Jupyter display an object by its ``repr``; a dataclass's is every field, so a fit
showed its std and ci dicts and a target answer its column objects, with the answer and its
DEGENERATE / UNRESOLVED lines nowhere. IPython asks ``_repr_pretty_`` first: these objects
answer with their ``str``. ``repr`` stays the dataclass's, for debugging.
"""

from __future__ import annotations

from typing import Any


class ShownAsText:
    """Displayed in IPython and Jupyter as ``str(self)``."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(f"{type(self).__name__}(...)" if cycle else str(self))
