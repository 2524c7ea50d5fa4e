"""Every error forge-bridge raises derives from `ForgeBridgeError`, and also from the built-in
exception a Python user would expect (a bad argument is still a `ValueError`), so
`except fb.ForgeBridgeError` catches the library's errors and nothing else."""

from __future__ import annotations


class ForgeBridgeError(Exception):
    """Base of every error forge-bridge raises."""


class InvalidArgument(ForgeBridgeError, ValueError):
    """An argument or setting has a value that cannot work; the message names it."""


class WrongType(ForgeBridgeError, TypeError):
    """An argument has the wrong type; the message names it and what was expected."""


class InvalidState(ForgeBridgeError, RuntimeError):
    """A call came in the wrong order, or on something closed or finished."""


class NotFound(ForgeBridgeError, KeyError):
    """What was asked for (a trajectory, an episode) does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Unsupported(ForgeBridgeError, NotImplementedError):
    """This kind of object cannot do that (a scripted policy has no weights to adapt)."""


class AgentError(ForgeBridgeError, RuntimeError):
    """The agent (the user's own code, run as an environment) raised; the cause is chained."""


class SchemaError(InvalidArgument):
    """Data that does not fit the schema; the message starts with the offending field."""


class StoreError(ForgeBridgeError, RuntimeError):
    """The store could not be opened or written; what was stored before is untouched."""


class EpisodeClosed(InvalidState):
    """A step was offered to an episode that has already ended."""


class RunExistsError(InvalidState):
    """A new run was started in a folder that holds another one."""


class PolicyError(ForgeBridgeError, RuntimeError):
    """A model call failed; the message says why and what to check."""


class PolicyUnavailable(PolicyError):
    """The policy server could not be reached (down, refused, timed out) after retries."""


class PolicyResponseError(PolicyError):
    """The policy answered, but not with something usable (HTTP error, bad JSON, no token ids)."""

    status: int | None = None
    """The HTTP status it answered with, where that is what was wrong."""


class ContextLengthExceeded(PolicyResponseError):
    """The prompt no longer fits the model's context: the episode cannot go on (a truncation,
    recorded as such by the recording protocol, not an outage)."""


class SandboxUnavailable(ForgeBridgeError, RuntimeError):
    """Commands were to run in a sandbox this machine cannot provide; nothing ran."""


class AdapterError(InvalidArgument):
    """An adapter could not be loaded (missing, corrupt, incompatible); nothing was swapped."""


class MissingExtra(ForgeBridgeError, ImportError):
    """An optional integration was used without its extra installed; the message names the
    `pip install` that fixes it."""


__all__ = ["AdapterError", "AgentError", "ContextLengthExceeded", "EpisodeClosed", "ForgeBridgeError",
           "InvalidArgument", "InvalidState", "MissingExtra", "NotFound", "PolicyError", "PolicyResponseError",
           "PolicyUnavailable", "RunExistsError", "SandboxUnavailable", "SchemaError", "StoreError", "Unsupported",
           "WrongType"]
