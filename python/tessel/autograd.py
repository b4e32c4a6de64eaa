"""Grad mode: ``no_grad()`` and friends, on the C++ rank context's flag (this thread's)."""

import contextlib
import functools

from . import _C


def is_grad_enabled():
    """True when ops record autograd history on this thread."""
    return _C.grad_enabled()


def set_grad_enabled(mode):
    """Sets this thread's grad mode; returns the previous one."""
    return _C.set_grad_enabled(bool(mode))


class _GradMode(contextlib.ContextDecorator):
    def __init__(self, mode):
        self._mode = mode
        self._before = []

    def __enter__(self):
        self._before.append(_C.set_grad_enabled(self._mode))
        return self

    def __exit__(self, *exc):
        _C.set_grad_enabled(self._before.pop())
        return False


def no_grad(func=None):
    """Context manager (or decorator) under which ops record no autograd history."""
    if func is not None and callable(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with _GradMode(False):
                return func(*args, **kwargs)
        return wrapper
    return _GradMode(False)


def enable_grad():
    """Context manager under which ops record autograd history (inside a no_grad block)."""
    return _GradMode(True)
