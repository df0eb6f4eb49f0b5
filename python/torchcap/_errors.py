"""The exceptions torchcap raises (also from its compiled part, torchcap._C)."""


class Error(RuntimeError):
    """Base of the errors torchcap reports on purpose."""


class TraceError(Error):
    """A program could not be traced: an input it writes, a value read from a
    tensor's data, an argument or result of an unsupported type, ...

    The message names the operator or the argument, and the user's line."""


# Shown as torchcap.TraceError in tracebacks, where users import them from.
Error.__module__ = TraceError.__module__ = "torchcap"
