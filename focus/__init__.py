"""FOCUS: branching rollout collection for reinforcement learning of LLM agents.

Assemble a run from the names exported here; model clients live in
``focus.backends``; extension interfaces are re-exported by ``focus.extend``.
Names are loaded on first use, so ``import focus`` stays light (no torch, Prefect or
Dask at import time).
"""

from __future__ import annotations

from focus._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    # task side
    "Task": "focus.env",
    "Env": "focus.env",
    "Reset": "focus.env",
    "StepResult": "focus.env",
    "Action": "focus.env",
    "Message": "focus.env",
    "Tool": "focus.tools",
    "ToolEnv": "focus.tools",
    "tool": "focus.tools",
    "Workspace": "focus.workspace",
    "MemoryWorkspace": "focus.workspace",
    "DirectoryWorkspace": "focus.workspace",
    # model side
    "SamplingParams": "focus.policy",
    "Policy": "focus.policy",
    "Completion": "focus.policy",
    "PolicyFormat": "focus.format",
    "ByteCodec": "focus.format",
    "FinalAnswerParser": "focus.format",
    "JsonToolCallParser": "focus.format",
    "XmlToolCallParser": "focus.format",
    "AppendOnly": "focus.context",
    "Segments": "focus.context",
    "Summarize": "focus.context",
    "EveryDecision": "focus.branching",
    "SparseCheckpoints": "focus.branching",
    # running
    "Agent": "focus.agent",
    "BranchState": "focus.agent",
    "Tree": "focus.tree",
    "Batch": "focus.batch",
    "Collector": "focus.collector",
    "Phase": "focus.priority",
    "Selective": "focus.priority",
    "Uniform": "focus.priority",
    "Execution": "focus.execution",
    "ModelServiceOutage": "focus.execution",
    "BadResponses": "focus.execution",
    "RequestsRefused": "focus.refusals",
    "BrokenEnv": "focus.refusals",
    "Usage": "focus.usage",
    "ConstantCritic": "focus.critic",
    "HttpCritic": "focus.critic",
    "LocalCritic": "focus.critic",
    "DirectBranchTd": "focus.estimation",
    "GroupNormalized": "focus.estimation",
    "NodeMonteCarlo": "focus.estimation",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
