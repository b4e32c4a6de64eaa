"""One OpenBLAS kernel set for both sides of a PyTorch comparison.

Both tessel and Debian's PyTorch 1.13 call the system OpenBLAS, whose kernel set sets the GEMM
rate. OpenBLAS picks it by CPU model, and a CPU newer than the library gets its generic SSE3 set;
tessel then switches to the set the CPU can run (src/tessel/core/context.h), which PyTorch does
not. So, unless OPENBLAS_CORETYPE is already set, the benches set it to the set tessel runs, for
every process they start: the comparison is of the two runtimes, not of two BLAS kernel sets.
"""
import os
import re
import subprocess


def use_tessels_blas_kernels(tessel_binary):
    """Sets OPENBLAS_CORETYPE (if unset) to the kernel set `tessel --version` reports; returns
    the description to print, e.g. "OpenBLAS 0.3.21, Cooperlake kernels (OPENBLAS_CORETYPE=...)"."""
    def describe():
        out = subprocess.run([tessel_binary, "--version"], capture_output=True, text=True).stdout.strip()
        return out[out.find("(") + 1:-1] if "(" in out else "unknown"

    if not os.environ.get("OPENBLAS_CORETYPE"):
        found = re.search(r", (\w+) kernels", describe())
        if found:
            os.environ["OPENBLAS_CORETYPE"] = found.group(1)
    return describe()
