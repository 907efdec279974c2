"""The one error type a user sees. Its message names the field, file or row and says what to do."""


class PosttrainError(Exception):
    """A mistake in the user's input or environment, reported without a traceback by the CLI."""

    def __init__(self, message: str, *, hint: str | None = None):
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  -> {hint}")


def user_message(error: PosttrainError) -> str:
    """What the user is told. An error raised inside a Ray actor reaches the driver as Ray's RayTaskError made a
    subclass of it, whose text is the remote traceback; its `cause` is the error the actor raised, message and hint."""
    cause = getattr(error, "cause", None)
    return str(cause) if isinstance(cause, PosttrainError) else str(error)
