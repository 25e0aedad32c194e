"""Errors the runtime raises on purpose; their message becomes the run's `error`."""


class AgentRunError(Exception):
    """The run fails with this message (a contract broken by user code, a missing model...)."""


class AgentNotFound(AgentRunError):
    """A test, a chain or a trigger names an agent the project does not define."""


class InvocationTimedOut(BaseException):
    """The invocation's timeout passed and the runner asked it to end its run (case.py): the
    run fails with this message and its middleware cleanup still runs. A BaseException, so
    that user code's `except Exception` does not swallow it."""
