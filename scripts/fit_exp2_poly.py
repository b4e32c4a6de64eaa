#!/usr/bin/env python3
"""Fit the polynomial of fast::exp2_16_finite (src/tessel/ops/fast_math.h): 2^r on [0, 1] by a
degree-6 polynomial minimising the largest relative error (Remez exchange, in double), then
print its coefficients rounded to float32 and the largest relative error before and after that
rounding (exact arithmetic; the kernel's float32 Horner steps add their own roundings).

    python3 scripts/fit_exp2_poly.py

Plain Python (no numpy), a few seconds."""
import math
import struct

DEGREE = 6
GRID = 20000  # points where the error curve's extrema are looked for


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def solve(a, b):
    """x with a·x = b, by Gaussian elimination with partial pivoting."""
    n = len(a)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def horner(c, t):
    p = 0.0
    for ck in reversed(c):
        p = p * t + ck
    return p


def relative_errors(c, ts):
    return [horner(c, t) / 2.0**t - 1.0 for t in ts]


def fit():
    n = DEGREE + 1
    # n + 1 reference points, first at the Chebyshev extrema of [0, 1]
    points = [0.5 - 0.5 * math.cos(math.pi * k / n) for k in range(n + 1)]
    grid = [i / GRID for i in range(GRID + 1)]
    coeffs = None
    for _ in range(30):
        # p(t_i) / 2^t_i - 1 = (-1)^i E at every reference point: n coefficients and E
        rows = [[t**j / 2.0**t for j in range(n)] + [(-1) ** i] for i, t in enumerate(points)]
        solution = solve(rows, [1.0] * (n + 1))
        coeffs = solution[:n]
        err = relative_errors(coeffs, grid)
        # the new reference: the largest error in each run of one sign
        runs, start = [], 0
        for k in range(1, len(err)):
            if (err[k] > 0) != (err[k - 1] > 0):
                runs.append((start, k))
                start = k
        runs.append((start, len(err)))
        if len(runs) != n + 1:
            break
        points = [grid[max(range(a, b), key=lambda k: abs(err[k]))] for a, b in runs]
    return coeffs


def main():
    coeffs = fit()
    fine = [i / 200000 for i in range(200001)]
    print(f"largest relative error: {max(abs(e) for e in relative_errors(coeffs, fine)):.3g}")
    rounded = [f32(c) for c in coeffs]
    print(f"with float32 coefficients: {max(abs(e) for e in relative_errors(rounded, fine)):.3g}")
    print("coefficients, r^0 first:")
    for c in rounded:
        print(f"  {c:.15e}f")


if __name__ == "__main__":
    main()
