"""tessel: train large networks across many devices from a program written for one.

The Python front end of tessel's C++ core. What is bound so far (see docs/python.md):
tensors with NumPy interop, dtypes, the op registry (every op as ``tessel.<name>`` and
``tessel.ops.<name>``, generated from the registry), arithmetic operators, indexing by ints and
slices, autograd (``backward()``, ``.grad``, ``no_grad()``, ``stop_gradient``), and Philox
random tensors that match the C++ ``rng_fill`` bit for bit.
"""

from . import _C
from ._C import (  # noqa: F401  (the public names)
    CheckpointError,
    CommError,
    CommTimeoutError,
    Error,
    InputError,
    InternalError,
    Tensor,
    arange,
    from_numpy,
    full,
    ones,
    to_tensor,
    zeros,
)
from . import ops  # noqa: F401
from .autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled  # noqa: F401
from .random import get_seed, rand, randn, seed, uniform, normal  # noqa: F401

dtype = _C.dtype
float32 = _C.dtype.float32
float64 = _C.dtype.float64
bfloat16 = _C.dtype.bfloat16
int32 = _C.dtype.int32
int64 = _C.dtype.int64
bool_ = _C.dtype.bool

# Every registry op at the top level too (tessel.softmax(x, dim=-1)), unless a name above
# already means something else.
for _name in ops.__all__:
    if _name not in globals():
        globals()[_name] = getattr(ops, _name)
del _name

__version__ = "0.1.0"
