"""Symbolic checks of the multi-bin batching paper's derivations (Sections 4-5,
Appendices A-B), backing the errata in theory/NOTES.md.

Optional: needs sympy, which is *not* a dependency of mbbatch.  Run with any
Python that has sympy installed::

    python theory/check_symbolic.py

Every check prints one line "ok  <what>"; a failed check raises
AssertionError.  Exits with status 0 and a notice when sympy is missing.
"""

from __future__ import annotations

import sys

try:
    import sympy as sp
except ImportError:  # pragma: no cover
    print("sympy is not installed; skipping the symbolic checks")
    sys.exit(0)


def ok(what):
    print(f"ok  {what}")


def zero(expr):
    return sp.simplify(sp.expand(expr)) == 0


a, b, x = sp.symbols("a b x", real=True)
lmin, lmax = sp.symbols("l_min l_max", positive=True)
D = lmax - lmin
m = (lmax + lmin) / 2

# ---------------------------------------------------------------- eq. (8)
for B in range(1, 9):
    # max of B iid U(a, b): density B (x-a)^(B-1) / (b-a)^B
    e_max = sp.integrate(x * B * (x - a) ** (B - 1) / (b - a) ** B, (x, a, b))
    e_min = sp.integrate(x * B * (b - x) ** (B - 1) / (b - a) ** B, (x, a, b))
    corrected = a / (B + 1) + sp.Rational(B) * b / (B + 1)
    printed = sp.Rational(B) * a / (B + 1) + b / (B + 1)
    assert zero(e_max - corrected), B
    assert zero(e_min - printed), B
    if B > 1:
        assert not zero(e_max - printed), B
ok("eq. (8): E[max of B U(a,b)] = a/(B+1) + B b/(B+1); the printed form is E[min] (B = 1..8)")

# ---------------------------------------------------- eqs. (10)-(16)
Bs = sp.symbols("B", positive=True)
for k in range(2, 7):
    ls = sp.symbols(f"l1:{k}", real=True)
    edges = [lmin, *ls, lmax]
    f_corr = sum((edges[i] - edges[i - 1]) / D
                 * (edges[i - 1] / (Bs + 1) + Bs * edges[i] / (Bs + 1)) for i in range(1, k + 1))
    f_print = sum((edges[i] - edges[i - 1]) / D
                  * (Bs * edges[i - 1] / (Bs + 1) + edges[i] / (Bs + 1)) for i in range(1, k + 1))
    c = (Bs - 1) / ((Bs + 1) * D)
    for i in range(1, k):
        eq12 = c * (-edges[i + 1] + 2 * edges[i] - edges[i - 1])
        assert zero(sp.diff(f_corr, edges[i]) - eq12), (k, i)
        assert zero(sp.diff(f_print, edges[i]) + eq12), (k, i)
    H = sp.hessian(f_corr, ls)
    eq14 = c * sp.Matrix(k - 1, k - 1, lambda i, j: 2 if i == j else (-1 if abs(i - j) == 1 else 0))
    assert all(zero(v) for v in (H - eq14))
    assert all(zero(v) for v in (sp.hessian(f_print, ls) + eq14))
    assert zero(H.det() - k * c ** (k - 1))                                    # eq. (15)
    for j in range(1, k):
        assert zero(H[:j, :j].det() - (j + 1) * c ** j)                       # Sylvester
    sol = sp.solve([sp.diff(f_corr, li) for li in ls], ls, dict=True)[0]
    for i, li in enumerate(ls, start=1):
        assert zero(sol[li] - (lmin + sp.Rational(i, k) * D))                  # eq. (16)
ok("eqs. (10)-(16) with the corrected eq. (8): gradient (12), Hessian (14), det (15), "
   "leading minors (j+1) c^j, stationary point (16); printed eq. (8) flips the Hessian sign (k = 2..6)")

# ---------------------------------------------------- eqs. (17)-(21)
ks, i = sp.symbols("k i", positive=True, integer=True)
li = lmin + i / ks * D
li1 = lmin + (i - 1) / ks * D
e17 = sp.summation((Bs * li / (Bs + 1) + li1 / (Bs + 1)) / ks, (i, 1, ks))
e19 = (Bs / (Bs + 1) * (ks + 1) / 2 * D + 1 / (Bs + 1) * (ks - 1) / 2 * D) / ks + lmin
e20 = m + (Bs / (Bs + 1) * lmax + lmin / (Bs + 1) - m) / ks
assert zero(e17 - e19) and zero(e19 - e20)
assert zero(e20 - (m + (Bs - 1) * D / (2 * (Bs + 1) * ks)))
assert zero(sp.diff(Bs / e20, ks) - (Bs * (Bs - 1) * D / (2 * (Bs + 1) * ks ** 2)) / e20 ** 2)
assert zero(sp.limit(Bs / e20, ks, sp.oo) - Bs / m)                           # eq. (5)
ok("eqs. (17)-(21): E[t_service,k] = m + (B-1) D / (2 (B+1) k); throughput increasing in k; "
   "limit B/m (eq. 5)")

# ---------------------------------------------------- eqs. (22)-(26)
eps = sp.symbols("epsilon", positive=True)
cmax = Bs / m
abr = Bs / (Bs + 1) * lmax + lmin / (Bs + 1) - m
kthr = sp.solve(sp.Eq(cmax - eps, Bs / (m + abr / ks)), ks)
assert len(kthr) == 1 and zero(kthr[0] - (cmax - eps) * abr / (eps * m))
lhs25 = Bs - eps * m + (cmax - eps) * abr / ks
assert zero(lhs25 - (cmax - eps) * (m + abr / ks))
ok("eqs. (22)-(26): Throughput_k = c_max - eps exactly at k = (c_max - eps) a / (eps m)")
assert sp.nsimplify(sp.Rational(128) / sp.Rational(21, 2)) == sp.Rational(256, 21)
assert abs(float(sp.Rational(256, 21)) - 12.19) < 0.001
ok("Section 4 text: c_max = 128 / 10.5 = 256/21 = 12.19 (printed ~ 12.3)")

# ---------------------------------------------------- eq. (63)
j, Bn, lam = sp.symbols("j B lambda", positive=True)
e63 = sp.summation((Bn - j) * ks / lam, (j, 1, Bn)) / Bn
assert zero(e63 - (Bn - 1) * ks / (2 * lam))
ok("eq. (63): (1/B) sum_j (B-j) k / lam = (B-1) k / (2 lam)")

# ---------------------------------------------------- eqs. (32)-(49)
HB = sp.symbols("H_B", positive=True)
for k in range(2, 7):
    qs = sp.symbols(f"q1:{k}", positive=True)
    q = [sp.Integer(1), *qs]
    f33 = sum((q[i - 1] - q[i]) * sp.log(1 / q[i]) for i in range(1, k)) \
        + q[k - 1] * (sp.log(1 / q[k - 1]) + HB)
    f34 = sum((q[i] - q[i - 1]) * sp.log(q[i]) for i in range(1, k)) \
        + q[k - 1] * (HB - sp.log(q[k - 1]))
    assert zero(sp.expand_log(f33 - f34, force=True))
    for i in range(1, k - 1):                                                  # eq. (35)
        assert zero(sp.diff(f34, q[i]) - (sp.log(q[i]) + (q[i] - q[i - 1]) / q[i] - sp.log(q[i + 1])))
    assert zero(sp.diff(f34, q[k - 1]) - (HB - q[k - 2] / q[k - 1]))          # eq. (36)
    H = sp.hessian(f34, qs)
    n = k - 1
    eq37 = sp.zeros(n, n)
    for r in range(1, n + 1):
        eq37[r - 1, r - 1] = (1 / q[r] + q[r - 1] / q[r] ** 2) if r < n else q[r - 1] / q[r] ** 2
        for s in range(1, n + 1):
            if abs(r - s) == 1:
                eq37[r - 1, s - 1] = -1 / q[max(r, s)]
    assert all(zero(v) for v in (H - eq37))                                   # eq. (37)
    assert H.is_symmetric()
    if n >= 2:
        assert not zero(H[0, 1] - (-1 / q[1]))                                # eq. (38) printed
        assert zero(H[0, 1] + 1 / q[2])
    # eq. (41): leading minors f_n for n <= k-2; eq. (48): the determinant
    fprev = sp.Integer(1)
    for r in range(1, n):
        fr = 1 / (sp.prod(q[1:r]) * q[r] ** 2) + fprev / q[r]
        assert zero(H[:r, :r].det() - fr), (k, r)
        fprev = fr
    assert zero(H.det() - 1 / (sp.prod(q[1:n]) * q[n] ** 2))
ok("eqs. (32)-(49): derivatives (35)-(37), Hessian symmetric with (i,i+1) = -1/q_{i+1} "
   "(eq. 38 prints -1/q_i), leading minors (41) and determinant (48) (k = 2..6)")

# ---------------------------------------------------- eqs. (50)-(59), (60)
for k in range(1, 8):
    Ls = sp.symbols(f"L1:{k + 1}", positive=True)  # L_1 .. L_k
    L = {mm: Ls[mm - 1] for mm in range(1, k + 1)}
    # eq. (58): q_i = 1 / prod_{j<=i} L_{k-j}; stationarity (50)-(51) under
    # the recursion log L_m = L_{m+1} - 1 (eq. 29) and H_B = L_1
    rec = {sp.log(L[mm]): L[mm + 1] - 1 for mm in range(1, k)}
    q = [sp.Integer(1)] + [1 / sp.prod([L[k - jj] for jj in range(1, ii + 1)]) for ii in range(1, k)]
    if k >= 2:
        g_last = L[1] - q[k - 2] / q[k - 1]                                   # eq. (50)
        assert zero(g_last)
        for ii in range(1, k - 1):                                            # eq. (51)
            g = sp.expand_log(sp.log(q[ii]) + (q[ii] - q[ii - 1]) / q[ii] - sp.log(q[ii + 1]),
                              force=True).subs(rec)
            assert zero(g), (k, ii)
    # corrected eq. (60) denominator telescopes to L_k
    logs = lambda ii: sum(sp.log(L[k - jj]) for jj in range(1, ii + 1))  # noqa: E731
    T = sum((L[k - ii] - 1) / sp.prod([L[k - jj] for jj in range(1, ii + 1)]) * logs(ii)
            for ii in range(1, k))
    T += (logs(k - 1) + L[1]) / sp.prod([L[k - jj] for jj in range(1, k)])
    assert zero(sp.expand(T.subs(rec)) - L[k]), k
ok("eqs. (50)-(59): the edges of eq. (59) are stationary; corrected eq. (60): "
   "the bound at those edges is exactly L_k / mu (k = 1..7)")

# ---------------------------------------------------- eq. (60) as printed
# The printed inner sums run over log(L_{k-1-j}), j = 1..i, i <= k-1: at
# i = k-1, j = k-1 the index is 0, and eq. (29) defines L_m only for m >= 1.
for k in range(2, 8):
    assert min(k - 1 - jj for jj in range(1, k)) == 0
ok("eq. (60) as printed: the inner sums reach log(L_0), which eq. (29) leaves undefined")

# ---------------------------------------------------- numeric spot check, eq. (59)
import mpmath as mp  # noqa: E402  (a dependency of sympy)

mp.mp.dps = 30
B, mu, k = 200, mp.mpf("0.1"), 5
Hn = mp.harmonic(B)
Lv = [Hn]
for _ in range(k - 1):
    Lv.append(1 + mp.log(Lv[-1]))
S = [mp.mpf(0)]
for jj in range(1, k):
    S.append(S[-1] + mp.log(Lv[k - jj - 1]))
edges = [s / mu for s in S]
qv = [mp.e ** (-mu * e) for e in edges]
bound = sum((qv[ii - 1] - qv[ii]) * edges[ii] for ii in range(1, k)) + qv[k - 1] * (edges[k - 1] + Hn / mu)
assert abs(bound - Lv[k - 1] / mu) < mp.mpf("1e-25")
ok(f"eq. (27) at eq. (59) edges, B=200, mu=0.1, k=5: {mp.nstr(bound, 15)} = L_5 / mu")
