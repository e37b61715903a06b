"""MATH quick start: an Env whose reward is a verifier of answer equivalence."""

from examples.math.env import MathEnv, math_tasks
from examples.math.problems import Problem, generate_problems
from examples.math.verifier import answers_equivalent

__all__ = ["MathEnv", "Problem", "answers_equivalent", "generate_problems", "math_tasks"]
