"""What of a collection's branch states does not pickle, named.

An env's state must be plain, picklable data (:class:`focus.env.Env`): the pipeline
pickles every checkpoint's branch state into its checkpoint store, and Dask ships each
to its workers. A state that holds a lock, a client, a generator or an open file stopped
a collection with ``TypeError: cannot pickle '_thread.lock' object``, which named
neither the task, the step nor the part. These functions name them; they pickle part by
part, so they run only once pickling the whole has failed.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any


def _pickles(value: Any) -> BaseException | None:
    """Why ``value`` does not pickle (cloudpickle, as the store and Dask pickle, where it
    is installed: it takes lambdas and local classes), or ``None``."""
    try:
        import cloudpickle

        cloudpickle.dumps(value)
    except ImportError:
        try:
            pickle.dumps(value)
        except Exception as e:  # noqa: BLE001 - any failure to pickle is the answer
            return e
    except Exception as e:  # noqa: BLE001 - any failure to pickle is the answer
        return e
    return None


def unpicklable_part(state: Any) -> str | None:
    """What of one branch state (:class:`focus.agent.BranchState`) does not pickle, as
    ``the env state of task 't' at step 2 (TypeError: ...)``, or ``None``."""
    task = getattr(state, "task", None)
    parts = (
        ("env state", getattr(state, "env_state", None)),
        ("task data", getattr(task, "data", None)),
        ("workspace", getattr(state, "workspace", None)),
        ("context", getattr(state, "context", None)),
    )
    for name, value in parts:
        error = _pickles(value)
        if error is not None:
            where = f" of task {task.id!r} at step {state.steps}" if task is not None else ""
            return f"the {name}{where} ({type(error).__name__}: {error})"
    return None


def unpicklable_in(trees: Iterable[Any]) -> str | None:
    """:func:`unpicklable_part` of the first branch state of ``trees`` (their checkpoints'
    ``states``) that does not pickle, or ``None``."""
    for tree in trees:
        for state in getattr(tree, "states", {}).values():
            found = unpicklable_part(state)
            if found is not None:
                return found
    return None


#: What to do about it, for the line that names it.
REMEDY = (
    "an env's state is plain, picklable data (focus.env.Env): keep locks, clients and open files in the env, "
    "made on first use, and a workspace's in its files"
)
