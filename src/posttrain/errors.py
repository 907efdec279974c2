"""The one error type a user sees. Its message names the field, file or row and says what to do."""


class PosttrainError(Exception):
    """A mistake in the user's input or environment, reported without a traceback by the CLI."""

    def __init__(self, message: str, *, hint: str | None = None):
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  -> {hint}")
