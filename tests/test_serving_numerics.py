"""The embedded server's numerics without torch: exp, log and GELU from basic operations,
the weights file read without torch, and the sampler's random stream."""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from focus.tinylm import numerics as N
from focus.tinylm.arch import DEFAULT_WEIGHTS, read_weights
from focus.tinylm.sampler import Stream

ULP = np.finfo(np.float64).eps


def _ulps(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want) / np.spacing(np.abs(want))))


def test_exp_and_log_are_within_a_few_units_in_the_last_place_of_libm():
    """Measured: at most 1.4 ulp (exp) and 2 ulp (log) from libm here; 4 leaves room for
    another libm's last bit."""
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-700, 700, 3000), rng.uniform(-1, 1, 3000), [0.0, 1e-300, -1e-300]])
    want = np.array([math.exp(v) for v in x])  # glibc: within an ulp of the true value
    assert _ulps(N.exp(x), want) <= 4.0
    assert N.exp(np.array([-np.inf, -800.0]))[0] == 0.0 and N.exp(np.array([-800.0]))[0] == 0.0
    y = np.concatenate([rng.uniform(1e-6, 10, 3000), rng.uniform(1, 1e6, 3000), [1.0, 0.5, 2.0, 1e-300]])
    assert _ulps(N.log(y), np.array([math.log(v) for v in y])) <= 4.0
    assert N.log(np.array([1.0]))[0] == 0.0 and N.log(np.array([0.0]))[0] == -np.inf


def test_gelu_is_the_exact_normal_cdf_form_to_double_precision():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(0, 3, 5000), np.linspace(-40, 40, 801), [0.0, -0.0]])
    want = np.array([0.5 * v * math.erfc(-v / math.sqrt(2.0)) for v in x])
    got = N.gelu(x)
    assert np.max(np.abs(got - want)) < 4e-15 * max(1.0, float(np.max(np.abs(x))))
    big = np.abs(want) > 1e-3
    assert np.max(np.abs(got[big] - want[big]) / np.abs(want[big])) < 1e-13


@pytest.mark.needs("torch")
def test_gelu_is_what_the_training_forward_computes():
    """torch's exact GELU, in float64."""
    import torch

    x = np.concatenate([np.random.default_rng(1).normal(0, 3, 5000), np.linspace(-40, 40, 801), [0.0, -0.0]])
    assert np.allclose(N.gelu(x), torch.nn.functional.gelu(torch.from_numpy(x)).numpy(), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("fn", [N.exp, N.log, N.gelu, N.softmax_numerators])
def test_a_map_gives_each_element_the_same_bits_wherever_it_sits(fn):
    """The invariance the serving forward rests on: a value's bits do not depend on the
    array around it (its length, its position, blocks of a large array, a strided view)."""
    rng = np.random.default_rng(2)
    x = rng.normal(0, 4, 3 * N._BLOCK + 17)
    if fn is N.softmax_numerators:
        x = -np.abs(x)
    elif fn is N.log:
        x = np.abs(x) + 1e-3
    whole = fn(x)  # blockwise
    for i in (0, 5, N._BLOCK - 1, N._BLOCK, 2 * N._BLOCK + 3, x.size - 1):
        assert fn(x[i : i + 1])[0] == whole[i]
        assert fn(np.concatenate([x[i : i + 1], x[:7]]))[0] == whole[i]
    assert np.array_equal(fn(x[::3]), whole[::3])  # a strided view
    assert np.array_equal(fn(x[::-1]), whole[::-1])


@pytest.mark.needs("torch")
def test_the_weights_file_reads_without_torch_as_torch_loads_it(tmp_path):
    from focus.tinylm.model import TinyLM, load, save

    weights = read_weights()
    model = load()
    state = model.state_dict()
    assert set(weights.state) == set(state)
    for name, arr in weights.state.items():
        assert arr.dtype == np.float32 and np.array_equal(arr, state[name].numpy()), name
    # a file saved by training reads back the same way
    path = tmp_path / "w.pt"
    save(TinyLM(weights.config), path)
    assert set(read_weights(path).state) == set(state)


@pytest.mark.needs("torch")
def test_a_weights_file_holding_anything_else_is_refused_unloaded(tmp_path):
    import torch

    # os.system, not print: a Prefect flow run earlier in the same process may have
    # swapped builtins.print for its own (log_prints), and the file would name that
    ran = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {ran}",))

    bad = tmp_path / "evil.pt"
    torch.save({"config": {}, "state_dict": {"w": torch.zeros(2)}, "x": Payload()}, bad)
    with pytest.raises(
        ValueError, match=r"is not a tinylm weights file: it holds \S*system, which a weights file never does"
    ):
        read_weights(bad)
    assert not ran.exists()  # never run
    other = tmp_path / "other.pt"
    torch.save({"config": {"d_model": 7, "n_heads": 2}, "state_dict": {}}, other)
    with pytest.raises(ValueError, match="not a tinylm weights file: d_model 7 is not divisible"):
        read_weights(other)
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"config": {}}))
    with pytest.raises(ValueError, match="not a torch checkpoint"):
        read_weights(plain)


def test_the_sampler_stream_is_pcg64_and_pinned():
    """Uniforms are the top 53 bits of PCG64 seeded through numpy's SeedSequence, a stream
    numpy keeps stable: the same seed samples the same tokens on every machine."""
    s = Stream(123)
    assert [s.uniform() for _ in range(3)] == [0.6823518632481435, 0.053821018802222675, 0.22035987277261138]
    assert Stream(0).uniform() == np.random.default_rng(0).random() == 0.6369616873214543


def test_the_server_and_its_engine_import_no_torch():
    code = textwrap.dedent(
        """
        import sys
        import focus.tinylm.server, focus.tinylm.app
        from focus.tinylm.engine import Engine, GenRequest
        res = Engine().generate(GenRequest((1, 2, 3), max_tokens=3, seed=0, ignore_eos=True))
        assert len(res.token_ids) == 3, res
        loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
        assert not loaded, loaded[:5]
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.slow
@pytest.mark.needs("torch")
def test_serving_and_training_forwards_agree_on_every_position():
    """The serving forward (numpy, exact sums) against the training forward (torch,
    float32): log-probs within 1e-4 over a 600-token prompt, positions past 512 included."""
    from focus.tinylm.engine import Engine, GenRequest
    from focus.tinylm.model import load, prompt_logprobs

    ids = tuple(int(v) for v in np.random.default_rng(3).integers(0, 256, 600))
    res = Engine(prefix_cache_tokens=0).generate(GenRequest(ids, max_tokens=0, prompt_logprobs=0))
    assert res.prompt_logprobs is not None
    served = np.array([d.logprob for d in res.prompt_logprobs[1:]])
    train = prompt_logprobs(load(DEFAULT_WEIGHTS), ids).numpy()
    want = train[np.arange(len(ids) - 1), np.array(ids[1:])]
    assert np.max(np.abs(served - want)) < 1e-4
