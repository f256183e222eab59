"""The models package's error, in a module of its own so that loading and its helpers can both raise it."""

from asyncrl.errors import UserInputError


class ModelLoadError(UserInputError, RuntimeError):
    """A model or tokenizer directory could not be loaded; the message names the path and the reason."""
