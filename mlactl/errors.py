"""One exception type for bad user input: the CLI prints its message as one line and exits 2."""


class MlactlError(ValueError):
    """A user-facing error: the message says what is wrong and, where it can, what would be right."""
