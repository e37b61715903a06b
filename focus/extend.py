"""Every extension interface in one place: subclass these to change one role."""

from focus.branching import BranchPoints
from focus.context import ContextManager
from focus.critic import Critic
from focus.env import Env
from focus.estimation import Estimator
from focus.execution import Execution
from focus.format import ActionParser, ChatCodec
from focus.policy import Policy
from focus.priority import Priority
from focus.workspace import Workspace

__all__ = [
    "ActionParser",
    "BranchPoints",
    "ChatCodec",
    "ContextManager",
    "Critic",
    "Env",
    "Estimator",
    "Execution",
    "Policy",
    "Priority",
    "Workspace",
]
