"""Exceptions raised by normc.

Every error normc raises on purpose derives from :class:`NormcError`, so a caller can catch them all at once.
"""


class NormcError(Exception):
    """Base class of every error normc raises on purpose."""


class SpecError(NormcError, ValueError):
    """A spec's text or keyword sizes are invalid.

    Attributes:
        text: the spec text (or ``None`` when the error is not about the text).
        pos: 0-based character offset of the problem in ``text`` (or ``None``).

    ``str(err)`` gives the message and, when a position is known, the text with a caret under it.
    """

    def __init__(self, message, text=None, pos=None):
        self.message = message
        self.text = text
        self.pos = pos
        if text is not None and pos is not None:
            pos = max(0, min(pos, len(text)))
            from .spec import _SPACE  # (here, not at the top: normc.spec imports this module)

            # on one line, so the caret lines up: each whitespace character the grammar takes (newline, tab, ...)
            # as one space, any other unprintable one (a no-break space, an escape) as '?'
            shown = "".join(" " if c in _SPACE else c if c.isprintable() else "?" for c in text)
            full = f"{message}\n  {shown}\n  {' ' * pos}^"
        elif text is not None:
            full = f"{message} (in spec {text!r})"
        else:
            full = message
        super().__init__(full)


class ArgumentError(NormcError, ValueError):
    """A call's argument does not fit the spec or normc's requirements (shape, rank, dtype, device, size).

    The message names the argument and what was expected.
    """


class CompileError(NormcError, RuntimeError):
    """Lowering a plan to PTX, or PTX to a loadable module, failed."""


def check_flag(value, name, error=ArgumentError) -> bool:
    """``value`` as a bool, where it is one (``bool`` or numpy's ``bool_``); else ``error`` (ArgumentError, or
    SpecError for the spec constructors) naming ``name``: a truthy string such as ``'no'`` would otherwise
    silently mean True."""
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise error(f"{name} is {value!r}; expected True or False")
