"""MATH quick start: an Env whose reward is a verifier of answer equivalence.

The names below are imported on first use (:func:`focus._lazy.lazy_exports`), not
here: ``python -m examples.math.problems`` (or ``.env``, ``.verifier``) imports this
package first, and a package that imported the module being run made Python's ``-m``
runner warn ``RuntimeWarning: 'examples.math.problems' found in sys.modules after
import of package 'examples.math', but prior to execution`` before every run."""

from focus._lazy import lazy_exports

_EXPORTS = {
    "MathEnv": "examples.math.env",
    "math_tasks": "examples.math.env",
    "Problem": "examples.math.problems",
    "generate_problems": "examples.math.problems",
    "answers_equivalent": "examples.math.verifier",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = ["MathEnv", "Problem", "answers_equivalent", "generate_problems", "math_tasks"]
