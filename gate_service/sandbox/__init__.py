"""The sandbox: the port (``port``), the factory that picks its backend (``factory``), and the
backends themselves (``docker`` today).

The worker and the rest of the service import this package root only, never a backend module:
only a backend imports its engine library (``docker``), and only when the factory picks it.
The package imports config, errors, scratch and gate_runner, and its backends what they
build from (bundles: requirements and wheels, for the runner image); never the worker, the
API, the CLI or the database.
"""

from .factory import (
    BACKENDS,
    SandboxSettingError,
    backend_names,
    case_network,
    chosen_backend,
    open_sandbox,
)
from .port import (
    BUILD_DEADLINE_LABEL,
    BUILD_ID_LABEL,
    BUILD_IMAGE_LABEL,
    BUILD_STAGE,
    BUNDLE_DEPS_DIR,
    INVOCATION_UID,
    LABEL,
    NO_NETWORK,
    SCRATCH_DIR,
    BuildRefused,
    CaseContainer,
    CaseRunner,
    Halted,
    ImageBuilder,
    ImageInfo,
    ModelChannel,
    NetworkPolicy,
    RunLimits,
    RunResult,
    Sandbox,
    SandboxError,
    TestImageSpec,
    build_step_expired,
)

__all__ = [
    "BACKENDS",
    "BUILD_DEADLINE_LABEL",
    "BUILD_ID_LABEL",
    "BUILD_IMAGE_LABEL",
    "BUILD_STAGE",
    "BUNDLE_DEPS_DIR",
    "INVOCATION_UID",
    "LABEL",
    "NO_NETWORK",
    "SCRATCH_DIR",
    "BuildRefused",
    "CaseContainer",
    "CaseRunner",
    "Halted",
    "ImageBuilder",
    "ImageInfo",
    "ModelChannel",
    "NetworkPolicy",
    "RunLimits",
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxSettingError",
    "TestImageSpec",
    "backend_names",
    "build_step_expired",
    "case_network",
    "chosen_backend",
    "open_sandbox",
]
