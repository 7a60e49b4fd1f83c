"""The single exception class for bad input."""


class SpecError(ValueError):
    """Raised for any input the specification does not define.

    The message names the function and the argument, what was received and what was expected,
    for example ``sdpa: k.shape[-1]=32 must equal q.shape[-1]=64``.
    """
