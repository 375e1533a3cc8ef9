"""fusedopt's exceptions: the C++ library's, one Python class each, all under fusedopt.Error."""


class Error(RuntimeError):
    """Root of every exception fusedopt raises."""


class UsageError(Error, ValueError):
    """The API was used wrongly: a bad argument, a tensor that does not fit (the message names
    the tensor and the reason)."""


class UnavailableError(Error):
    """Something fusedopt needs is not here (NVRTC, the CUDA driver, a device)."""


class IoError(Error):
    """A file could not be read or written, or is malformed (a checkpoint)."""


class RuleError(Error, ValueError):
    """A malformed rule. str() is the compiler-style diagnostic ``FILE:LINE:COL: error: ...``
    with the source line and a caret; the parts are attributes."""

    def __init__(self, what, file="<rule>", line=0, column=0, message="", source_line="",
                 hint=""):
        super().__init__(what)
        self.file = file
        self.line = line
        self.column = column
        self.message = message
        self.source_line = source_line
        self.hint = hint


class CompileError(Error):
    """A generated source that the compiler rejected; ``log`` and ``source`` say why."""

    def __init__(self, what, log="", source=""):
        super().__init__(what)
        self.log = log
        self.source = source


class CudaError(Error):
    """A CUDA driver or NVRTC call failed."""


class CacheError(Error):
    """The kernel cache refused an operation (an unsafe folder, an I/O failure)."""


class InternalError(Error):
    """A bug in fusedopt itself: please report it."""
