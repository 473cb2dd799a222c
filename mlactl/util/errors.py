"""One exception type for bad user input: the CLI prints its message as one line and exits 2."""

import warnings


class MlactlError(ValueError):
    """A user-facing error: the message says what is wrong and, where it can, what would be right."""


class MlactlWarning(UserWarning):
    """Something was skipped (a bad file in $MLACTL_HOME); the CLI prints it as one `Warning:` line."""


def warn(message: str) -> None:

    warnings.warn(message, MlactlWarning, stacklevel=2)
