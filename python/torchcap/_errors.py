"""The exceptions torchcap raises (also from its compiled part, torchcap._C)."""


class Error(RuntimeError):
    """Base of the errors torchcap reports on purpose."""


class TraceError(Error):
    """A program could not be traced: an input it writes, a value read from a
    tensor's data, an argument or result of an unsupported type, ...

    The message names the operator or the argument, and the user's line."""


class InputError(Error, TypeError):
    """A module made by torchcap.trace, torchcap.export or torchcap.load was
    called with arguments whose structure (how many, which nesting of tuples,
    lists and dicts, which keywords) is not the one it was traced with, or
    with something other than a tensor of the traced dtype and shape where
    it takes one (None, a NumPy array, a number, another shape).

    The message shows what was expected and what was given, naming each
    input. A TypeError too, which is what Python raises for a call with the
    wrong arguments."""


class WeightError(Error):
    """Weights given to torchcap.load do not fit the module's attributes (a
    missing, extra, mis-shaped or mis-typed weight), or a module loaded from a
    weightless file was called before its weights were bound.

    The message names every weight involved and what was expected."""


# Shown as torchcap.TraceError in tracebacks, where users import them from.
Error.__module__ = TraceError.__module__ = InputError.__module__ = WeightError.__module__ = \
    "torchcap"
