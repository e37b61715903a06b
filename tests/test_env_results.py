"""What an env's step may return (focus.env.check_step_result), without servers."""

import numpy as np
import pytest

from focus.env import EnvError, StepResult, check_step_result


def test_numpy_bool_done_is_read_as_a_bool_and_other_types_are_refused():
    """gym-style envs compute ``done`` with numpy (``np.bool_``): it is what the env
    meant, so it is taken as a plain bool; a string or a number is still a broken env."""
    for done in (np.True_, np.bool_(False)):
        got = check_step_result(StepResult(None, "o", np.float32(1.0), done), "Env.step")
        assert type(got.done) is bool and got.done == bool(done)
    for bad in ("yes", 1, np.int64(1), None):
        with pytest.raises(EnvError, match=r"Env.step returned done=.*expected a bool"):
            check_step_result(StepResult(None, "o", 0.0, bad), "Env.step")
