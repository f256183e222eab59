"""The models package's errors, in a module of their own so that loading, fp8 and the engines can all raise them."""

from asyncrl.errors import UserInputError


class ModelLoadError(UserInputError, RuntimeError):
    """A model or tokenizer directory could not be loaded; the message names the path and the reason."""


class WeightUpdateError(ValueError):
    """``update_weights`` got a tensor the rollout model has no parameter for, or one of the wrong shape (or fp8
    scales without their weight)."""
