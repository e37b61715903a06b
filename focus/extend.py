"""Every extension interface in one place: subclass these to change one role.

``ToolEnv`` (an Env from ``Tool`` declarations) is here too: subclass it, or declare
tools, for a tool-calling task (README.md's table of interfaces)."""

from focus.branching import BranchPoints
from focus.context import ContextManager
from focus.critic import Critic
from focus.env import Env
from focus.estimation import Estimator
from focus.execution import Execution
from focus.format import ActionParser, ChatCodec
from focus.policy import Policy
from focus.priority import Priority
from focus.tools import Tool, ToolEnv
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
    "Tool",
    "ToolEnv",
    "Workspace",
]
