"""The tiny model's definition without a framework: its configuration, position codes
and weights file.

Training (:mod:`focus.tinylm.model`) needs torch; serving
(:mod:`focus.tinylm.numerics`, the engine and the HTTP server) needs only numpy. Both
read the same weights file and the same position table from here, so the embedded
model server starts without importing torch (about a second of a collection's start).

The weights file is what :func:`focus.tinylm.model.save` writes: torch's zip format (a
pickle of ``{"config": ..., "state_dict": ...}`` whose tensors point at raw storages in
the archive). :func:`read_weights` reads it with a restricted unpickler that admits
only the few names such a file contains, as ``torch.load(weights_only=True)`` does.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from focus.format import ByteCodec

#: The committed initial weights.
DEFAULT_WEIGHTS = Path(__file__).parent / "weights" / "tinylm.pt"


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = ByteCodec.vocab_size
    d_model: int = 128
    n_layers: int = 3
    n_heads: int = 4
    max_len: int = 4096

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}")


def sinusoids(n: int, d: int) -> np.ndarray:
    """Fixed position codes (n, d) float32: no parameters, so the weights file stays small.

    Computed in float64 and rounded once to float32, so the table is the same on every
    machine (a float32 angle computed in float32 would move with the last bit of its
    frequency: at position 4,000 one unit in the last place is 2e-4 of the code)."""
    pos = np.arange(n, dtype=np.float64)[:, None]
    freq = np.exp(np.arange(0, d, 2, dtype=np.float64) * (-math.log(10000.0) / d))
    out = np.zeros((n, d), dtype=np.float64)
    out[:, 0::2] = np.sin(pos * freq)
    out[:, 1::2] = np.cos(pos * freq)
    return out.astype(np.float32)


def weights_version(path: str | os.PathLike[str]) -> str:
    """The policy version of a weights file: a short hash of its bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@dataclass(frozen=True)
class Weights:
    """A weights file's contents: the configuration and float32 arrays by parameter name."""

    config: TinyConfig
    state: dict[str, np.ndarray]


_STORAGES = {
    "HalfStorage": np.float16,
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
}


class _Storage:
    def __init__(self, dtype: Any) -> None:
        self.dtype = dtype


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *_: Any) -> Any:
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size, strides=[s * item for s in stride])
    return view.copy()


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(io.BytesIO(data))
        self.archive, self.prefix = archive, prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name in _STORAGES:
            return _Storage(_STORAGES[name])
        raise ValueError(f"it holds {module}.{name}, which a weights file never does (not loaded)")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Storage)):
            raise ValueError(f"unexpected storage reference {pid!r:.80}")
        raw = self.archive.read(f"{self.prefix}/data/{pid[2]}")
        return np.frombuffer(raw, dtype=np.dtype(pid[1].dtype).newbyteorder("<"))


def read_weights(path: str | os.PathLike[str] | None = None) -> Weights:
    """Read a weights file written by :func:`focus.tinylm.model.save` (the committed default
    when ``None``) without torch."""
    path = Path(path) if path is not None else DEFAULT_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"no tinylm weights file at {path}")
    try:
        with zipfile.ZipFile(path) as archive:
            (pkl,) = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            prefix = pkl.rsplit("/", 1)[0]
            order = (
                archive.read(f"{prefix}/byteorder").decode()
                if f"{prefix}/byteorder" in archive.namelist()
                else "little"
            )
            if order != "little":
                raise ValueError(f"byte order {order!r}")
            blob = _Unpickler(archive.read(pkl), archive, prefix).load()
        config = TinyConfig(**blob["config"])
        state = {str(k): np.asarray(v, dtype=np.float32) for k, v in blob["state_dict"].items()}
    except (zipfile.BadZipFile, EOFError, pickle.UnpicklingError) as e:
        raise ValueError(f"{path} is not a tinylm weights file: not a torch checkpoint") from e
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"{path} is not a tinylm weights file: {e}") from e
    return Weights(config, state)
