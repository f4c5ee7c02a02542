"""The errors autopar raises on bad input: each message is one line that says what to do."""


class AutoparError(Exception):
    """Base of autopar's own errors."""


class TraceError(AutoparError):
    """The model could not be turned into an operator graph."""


class InfeasibleError(AutoparError):
    """No plan fits the devices' memory; the message names the best autopar could reach."""

    def __init__(self, message: str, min_memory_per_device: float | None = None, plan=None):
        super().__init__(message)
        self.min_memory_per_device = min_memory_per_device
        self.plan = plan


class PlanMismatchError(AutoparError, ValueError):
    """A saved plan does not belong to this model, cluster or schema version."""


class LaunchRequiredError(AutoparError, RuntimeError):
    """Several devices were asked for, but no process group runs them: the message gives the command."""
