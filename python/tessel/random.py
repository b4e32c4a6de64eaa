"""Random tensors from tessel's counter-based Philox generator.

Element i of a draw is a function of (seed, stream, i) only — the C++ ``rng_fill`` — so the
same seed and stream give the same bits in Python and C++, on any number of ranks. ``seed(n)``
sets the seed the functions use when none is given; each such call takes the next stream.
"""

from . import _C

_state = {"seed": 0, "stream": 0}


def seed(value):
    """Sets the default seed and restarts the stream counter."""
    _state["seed"] = int(value)
    _state["stream"] = 0


def get_seed():
    """The default seed."""
    return _state["seed"]


def _draw(shape, distribution, a, b, dtype, seed_, stream):
    t = _C.zeros(list(shape), dtype if dtype is not None else _C.dtype.float32)
    if seed_ is None:
        seed_ = _state["seed"]
    if stream is None:
        stream = _state["stream"]
        _state["stream"] += 1
    _C.rng_fill(t, distribution, float(a), float(b), int(seed_), int(stream))
    return t


def uniform(shape, min=0.0, max=1.0, dtype=None, seed=None, stream=None):  # noqa: A002
    """Uniform in [min, max); (seed, stream) default to the generator's state."""
    return _draw(shape, "uniform", min, max, dtype, seed, stream)


def normal(shape, mean=0.0, std=1.0, dtype=None, seed=None, stream=None):
    """Normal with `mean` and `std`; (seed, stream) default to the generator's state."""
    return _draw(shape, "normal", mean, std, dtype, seed, stream)


def rand(shape, dtype=None, seed=None, stream=None):
    """Uniform in [0, 1)."""
    return uniform(shape, 0.0, 1.0, dtype, seed, stream)


def randn(shape, dtype=None, seed=None, stream=None):
    """Standard normal."""
    return normal(shape, 0.0, 1.0, dtype, seed, stream)
