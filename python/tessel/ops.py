"""The ops of tessel's registry, one function each, generated from the registry at import.

``tessel.ops.NAME(*tensors, *attributes, **attributes)`` calls the registry's op NAME through
the same dispatch as C++ (devices, distributed tensors, autograd). Tensors (or values NumPy
reads, or Python scalars after a first tensor) come first; the op's attributes follow, by
keyword or — for an op with a fixed number of inputs — positionally in the signature's order;
those not given take the registry's defaults (``OpDef::attrs``). ``tessel.ops.softmax(x)``,
``tessel.ops.sum(x, dims=[1], keepdim=True)``. An op with several outputs returns a list. A new
op in the registry appears here, signature and all, without a wrapper.
"""

import inspect

from . import _C

__all__ = []

_TYPES = {"int": "int", "float": "float", "bool": "bool", "ints": "list[int]", "str": "str", "dtype": "tessel.dtype"}


def _make(name):
    info = _C.op_info(name)
    n_inputs = info["inputs"]
    specs = info["attrs"]  # (name, type, default, required, internal)
    public = [a for a in specs if not a[4]]
    known = {a[0] for a in specs}

    def op(*args, **attributes):
        tensors = args
        if n_inputs >= 0 and len(args) > n_inputs:
            tensors, extra = args[:n_inputs], args[n_inputs:]
            if len(extra) > len(public):
                raise TypeError(f"{name}() takes {n_inputs} tensor(s) and {len(public)} attribute(s), "
                                f"got {len(args)} positional arguments")
            for spec, value in zip(public, extra):
                if spec[0] in attributes:
                    raise TypeError(f"{name}() got attribute '{spec[0]}' twice")
                attributes[spec[0]] = value
        for key in attributes:
            if key not in known:
                raise TypeError(f"{name}() has no attribute '{key}'; its attributes: "
                                + (", ".join(a[0] for a in public) or "none"))
        for spec in specs:
            if spec[0] not in attributes:
                if spec[2] is not None:
                    attributes[spec[0]] = spec[2]
                elif spec[3]:
                    raise TypeError(f"{name}() is missing its attribute '{spec[0]}' ({_TYPES[spec[1]]})")
        return _C.call_op(name, *tensors, **attributes)

    op.__name__ = name
    op.__qualname__ = name
    params = []
    if n_inputs < 0:
        params.append(inspect.Parameter("tensors", inspect.Parameter.VAR_POSITIONAL))
    else:
        params += [inspect.Parameter(f"x{i}" if n_inputs > 1 else "x", inspect.Parameter.POSITIONAL_ONLY)
                   for i in range(n_inputs)]
    kind = inspect.Parameter.KEYWORD_ONLY if n_inputs < 0 else inspect.Parameter.POSITIONAL_OR_KEYWORD
    for a_name, a_type, default, _required, _internal in public:
        params.append(inspect.Parameter(a_name, kind, annotation=_TYPES[a_type],
                                        default=inspect.Parameter.empty if default is None else default))
    op.__signature__ = inspect.Signature(params)
    inputs = "any number of" if n_inputs < 0 else str(n_inputs)
    op.__doc__ = (
        f"tessel's registry op '{name}': {inputs} tensor input(s); attributes: "
        + (", ".join(f"{a[0]}: {_TYPES[a[1]]}" + ("" if a[2] is None else f" = {a[2]!r}") for a in public) or "none")
        + f".\n\ndifferentiable: {info['differentiable']}; distributed tensors: {info['distributed']}; "
        f"kernels: {info['devices']}.\n(C++: call_op(op_by_name(\"{name}\"), inputs, attrs))"
    )
    return op


for _name in _C.op_names():
    globals()[_name] = _make(_name)
    __all__.append(_name)
del _name
