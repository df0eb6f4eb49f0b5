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


class FormatError(Error, ValueError):
    """A `.tcg` file could not be read: it is not one, it is damaged (a
    checksum that does not match, a truncated file), or it does not hold
    together (an operator its loader does not know, arguments that do not
    fit the operator's schema, an operator that fails on the shapes the file
    records). Every loader checks the same things (docs/FORMAT.md, "What the
    loaders verify").

    The message names the file, the byte offset of the problem and what it
    is, as the torchcap command prints it. A ValueError too, which is what
    torchcap.load raised before this class existed."""


class LintError(Error):
    """A graph broke one of the invariants its lint checks (an edited
    torch.fx graph given to torchcap.save, say); the message names the node."""


class PassError(Error):
    """A pass of torchcap.optimize_for_inference (or another pipeline of
    passes) failed or left a graph that does not pass lint; the message names
    the pass and the one before it."""


# Shown as torchcap.TraceError in tracebacks, where users import them from.
for _cls in (Error, TraceError, InputError, WeightError, FormatError, LintError, PassError):
    _cls.__module__ = "torchcap"
del _cls
