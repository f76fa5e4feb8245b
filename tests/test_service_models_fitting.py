"""Least-squares fits of the service models (mbbatch.service_models.fitting): exact recovery on
noise-free data, interval coverage on noisy data at a stated level, bounds, held-out errors and the
errors naming the column."""

import math

import numpy as np
import pytest

import mbbatch as mb
from mbbatch.service_models import (
    CalibratedModel,
    DecodeModel,
    IterationModel,
    FitResult,
    LinearModel,
    MaxModel,
)

from .test_service_models_iteration import ITER, _uniform_rows

PROMPT = np.array([10.0, 20.0, 30.0, 40.0])
OUTPUT = np.array([5.0, 50.0, 7.0, 9.0])


TRUE = [MaxModel(base=0.3, per_token=0.02), LinearModel(base=0.1, alpha=1e-3, beta=0.2),
        DecodeModel(beta=5e-3, gamma=0.3, prefill_per_token=1e-5),
        CalibratedModel(alpha=0.02, beta=5.74e-3, gamma=0.316)]


def _rows(model, n, rng, noise=0.0):
    """n measured batches of ``model``: aggregates of random members, times with N(0, noise^2) errors."""
    size = rng.integers(1, 64, n)
    max_output = rng.integers(20, 500, n).astype(float)
    cols = dict(size=size, max_output=max_output, max_seq_len=max_output + rng.integers(0, 3000, n),
                sum_prompt=rng.integers(0, 20_000, n).astype(float))
    cols["service"] = model.service_time(**{k: cols[k] for k in model._service_columns}) + rng.normal(0, noise, n)
    return cols


@pytest.mark.parametrize("true", TRUE, ids=lambda m: type(m).__name__)
def test_fit_recovers_noise_free_parameters(true):
    rows = _rows(true, 200, np.random.default_rng(0))
    res = type(true).fit(rows)
    assert isinstance(res, FitResult) and type(res.model) is type(true)
    for k in true._params:
        assert res.params[k] == pytest.approx(getattr(true, k), rel=1e-9)
        assert getattr(res.model, k) == res.params[k]
        assert res.stderr[k] <= 1e-9 * getattr(true, k)
    assert res.n == 200 and res.dof == 200 - len(true._params) and res.at_bound == ()
    assert res.rmse < 1e-12 * np.mean(rows["service"]) and res.r2 == pytest.approx(1.0, abs=1e-12)
    assert res.covariance.shape == (len(true._params),) * 2
    assert type(true).__name__ in str(res)


def test_fit_reads_dataframes_structured_arrays_and_tables():
    pd = pytest.importorskip("pandas")
    true = TRUE[3]
    rows = _rows(true, 50, np.random.default_rng(1))
    want = CalibratedModel.fit(rows).params
    rec = np.rec.fromarrays([rows["size"], rows["max_seq_len"], rows["service"]],
                            names="size,max_seq_len,service")
    for table in (pd.DataFrame(rows), np.asarray(rec), mb.Table(rows)):
        assert CalibratedModel.fit(table).params == want
    assert CalibratedModel.fit(rows, feedback="uncalibrated").model == CalibratedModel(**want, feedback="uncalibrated")


#: repetitions of the coverage experiment
REPS = 1500


@pytest.mark.parametrize("true", TRUE, ids=lambda m: type(m).__name__)
def test_fit_standard_errors_match_the_noise(true):
    """Gaussian noise (sd 0.01 s) on 40 batches, REPS = 1500 times: each
    parameter's 95% t-interval (fit +/- t_0.975,dof * stderr) must cover the
    truth in 1390 to 1456 of the repetitions, the central 99.993% of
    Binomial(1500, 0.95): a correct fit fails with probability 7e-5 per
    parameter, 8e-4 for the 12 of the test.  Standard errors 20% too small
    (coverage 89%) fail surely, 20% too large (98%) with probability 0.99.
    And the mean of rmse^2 n/dof must be sigma^2 within 4 sd of its sampling
    error, sd sigma^2 sqrt(2 / (dof REPS)) (a failure probability of 6e-5)."""
    from scipy import stats

    sigma, n = 0.01, 40
    rng = np.random.default_rng(2024)
    p = len(true._params)
    tq = stats.t.ppf(0.975, n - p)
    covered = dict.fromkeys(true._params, 0)
    s2 = []
    for _ in range(REPS):
        res = type(true).fit(_rows(true, n, rng, sigma), holdout=False)
        for k in true._params:
            covered[k] += abs(res.params[k] - getattr(true, k)) <= tq * res.stderr[k]
        s2.append(res.rmse ** 2 * n / res.dof)
    lo, hi = stats.binom.ppf([5e-5, 1 - 5e-5], REPS, 0.95)
    assert (lo, hi) == (1390, 1456)
    for k, c in covered.items():
        assert lo <= c <= hi, (k, c)
    assert abs(np.mean(s2) / sigma ** 2 - 1) < 4 * math.sqrt(2 / ((n - p) * REPS))


def test_fit_holds_a_negative_coefficient_at_its_bound():
    """No batch penalty in truth, noise: the unconstrained gamma is negative in
    about half the repetitions; the bounded fit holds it at 0 and is then the
    least-squares optimum over the domain (scipy's bounded trust-region fit
    in the model's own parameters finds no smaller sum of squares)."""
    from scipy.optimize import least_squares

    true = CalibratedModel(alpha=0.05, beta=2e-3, gamma=0.0)
    rng = np.random.default_rng(9)
    held = 0
    for _ in range(20):
        rows = _rows(true, 30, rng, 0.05)
        res = CalibratedModel.fit(rows)
        assert res.params["gamma"] >= 0.0
        if res.at_bound:
            held += 1
            assert res.at_bound == ("gamma",) and res.params["gamma"] == 0.0
        x = (rows["size"] - 1) / rows["size"]

        def resid(th, seq=rows["max_seq_len"], x=x, y=rows["service"]):
            return th[0] + th[1] * seq * (1 + th[2] * x) - y

        ref = least_squares(resid, [0.1, 1e-3, 0.1], bounds=([0, 1e-12, 0], np.inf), x_scale=[0.1, 1e-3, 0.1],
                            xtol=1e-15, ftol=1e-15, gtol=1e-15)
        rss = 2 * ref.cost
        assert res.rmse ** 2 * res.n <= rss * (1 + 1e-9)
    assert 3 <= held <= 17


def test_fit_errors_name_the_column_and_the_problem():
    rows = _rows(TRUE[3], 20, np.random.default_rng(4))
    with pytest.raises(ValueError, match=r"CalibratedModel.fit needs the columns size \(requests\), max_seq_len "
                                         r"\(tokens\); measurements lack max_seq_len"):
        CalibratedModel.fit({k: v for k, v in rows.items() if k != "max_seq_len"})
    with pytest.raises(ValueError, match="needs at least 4 measurement rows for 3 parameters .*; got 3"):
        CalibratedModel.fit({k: v[:3] for k, v in rows.items()})
    bad = dict(rows, service=np.where(np.arange(20) == 6, np.nan, rows["service"]))
    with pytest.raises(ValueError, match=r"column service must be finite \(s\); got column service\[6\] = nan"):
        CalibratedModel.fit(bad)
    bad = dict(rows, max_seq_len=-rows["max_seq_len"])
    with pytest.raises(ValueError, match=r"column max_seq_len must be in \[0, inf\) \(tokens\)"):
        CalibratedModel.fit(bad)
    with pytest.raises(TypeError, match="column size must hold integers"):
        CalibratedModel.fit(dict(rows, size=rows["size"].astype(float)))
    with pytest.raises(ValueError, match="one length"):
        CalibratedModel.fit(dict(rows, service=rows["service"][:-1]))
    with pytest.raises(ValueError, match=r"do not determine alpha, beta, gamma .*size too"):
        CalibratedModel.fit(dict(rows, size=np.ones(20, dtype=int)))
    with pytest.raises(ValueError, match="do not determine base, per_token .*two values"):
        MaxModel.fit({"max_output": np.full(5, 3.0), "service": np.arange(5.0)})
    # the best fit on the bound of an open domain: returned, no model
    res = MaxModel.fit({"max_output": np.arange(5.0), "service": 10.0 - np.arange(5.0)})
    assert res.model is None and res.at_bound == ("per_token",) and res.params["per_token"] == 0.0
    assert "per_token at 0, outside the domain" in res.note and "no model" in str(res)
    with pytest.raises(TypeError, match="measurements must be a DataFrame"):
        CalibratedModel.fit([[1, 2, 3]])
    with pytest.raises(TypeError, match="without field names"):
        CalibratedModel.fit(np.zeros((5, 3)))
    with pytest.raises(TypeError, match="gamma is fitted"):
        CalibratedModel.fit(rows, gamma=0.3)
    with pytest.raises(TypeError, match="feedback is not a field; the fields it takes fixed are: none"):
        LinearModel.fit(rows, feedback="legacy")


# --- the iteration model ---------------------------------------------------------------------


@pytest.mark.parametrize("columns", [("service",), ("prefill", "per_token"), ("service", "prefill", "per_token")])
@pytest.mark.parametrize("weights", ["absolute", "relative"])
def test_iteration_model_fit_recovers_known_coefficients(columns, weights):
    """Noise-free measurements of a known engine: every coefficient back to
    1e-8 relative, from whole batches, from the phases alone, or from both;
    in and out of sample errors of 0."""
    rows = _uniform_rows(ITER, np.random.default_rng(5))
    rows = {k: v for k, v in rows.items() if k in ("size", "prompt", "output", *columns)}
    res = IterationModel.fit(rows, weights=weights)
    for k in ITER._params:
        assert res.params[k] == pytest.approx(getattr(ITER, k), rel=1e-8), k
    assert type(res.model) is IterationModel and res.at_bound == () and res.weights == weights
    assert res.median_error < 1e-10 and res.max_error < 1e-10 and res.holdout_error < 1e-10
    assert res.holdout == "leave-one-out"


def test_fit_holdout_error_is_leave_one_out():
    """The held-out error is the median over rows of each row's relative error
    under the fit without it (checked by refitting by hand), with noise."""
    rng = np.random.default_rng(8)
    rows = {k: v for k, v in _uniform_rows(ITER, rng, 0.05, relative=True).items()
            if k in ("size", "prompt", "output", "service")}
    res = IterationModel.fit(rows, weights="relative")
    errs = []
    for i in range(rows["size"].size):
        keep = np.arange(rows["size"].size) != i
        fit = IterationModel.fit({k: v[keep] for k, v in rows.items()}, weights="relative")
        pred = fit.model.service_time(size=rows["size"][i], prompt=rows["prompt"][i], output=rows["output"][i])
        errs.append(abs(pred - rows["service"][i]) / rows["service"][i])
    assert res.holdout_error == pytest.approx(np.median(errs), rel=1e-9)
    assert res.median_error < res.holdout_error < 0.1 and res.max_error >= res.median_error
    # without the held-out refits: the same fit, no held-out error
    quick = IterationModel.fit(rows, weights="relative", holdout=False)
    assert quick.holdout == "none" and np.isnan(quick.holdout_error) and np.isnan(quick.holdout_errors).all()
    assert quick.holdout_errors.size == res.holdout_errors.size and "none" not in str(quick)
    for k in ("params", "rmse", "r2", "n", "dof", "at_bound", "median_error", "max_error"):
        assert getattr(quick, k) == getattr(res, k), k
    assert quick.stderr.keys() == res.stderr.keys()     # (NaN where a parameter is not fitted)
    assert np.array_equal(list(quick.stderr.values()), list(res.stderr.values()), equal_nan=True)
    assert quick.model == res.model and np.array_equal(quick.covariance, res.covariance, equal_nan=True)
    with pytest.raises(TypeError, match="IterationModel.fit: holdout must be True or False; got 'no'"):
        IterationModel.fit(rows, holdout="no")


def test_fit_takes_the_phases_only_where_the_model_times_them():
    rows = _uniform_rows(ITER, np.random.default_rng(6))
    with pytest.raises(ValueError, match="LinearModel.fit: measurements have a prefill column, which LinearModel "
                                         "cannot fit"):
        LinearModel.fit({k: rows[k] for k in ("size", "prompt", "output", "prefill")})
    with pytest.raises(ValueError, match="needs at least one measured time: a column service"):
        IterationModel.fit({k: rows[k] for k in ("size", "prompt", "output")})
    with pytest.raises(ValueError, match="weights must be 'absolute' or 'relative'"):
        IterationModel.fit(rows, weights="log")
    # DecodeModel from its phases: its prefill is prefill + TBT(b), its steps TBT(b)
    true = DecodeModel(beta=6e-3, gamma=0.4, prefill_per_token=1e-4)
    t = true.times(size=rows["size"], prompt=rows["prompt"], output=rows["output"])
    res = DecodeModel.fit(dict(size=rows["size"], prompt=rows["prompt"], output=rows["output"], prefill=t.ttft,
                               per_token=t.decode_tbt))
    assert res.params == pytest.approx({"beta": 6e-3, "gamma": 0.4, "prefill_per_token": 1e-4}, rel=1e-9)


def test_a_fit_on_a_bound_is_returned_with_the_bound_named():
    """Times that do not grow with batch size: the best per_sequence and
    per_context_token are 0 (the closed bound of their domain); the fit
    returns the model, naming them."""
    size = np.repeat([1, 8, 64], 6)
    L = np.tile([128.0, 256.0, 512.0, 1024.0, 1536.0, 2048.0], 3)
    service = 0.5 + 0.01 * L - 1e-5 * size * L        # faster with more requests: no physical engine
    res = IterationModel.fit(dict(size=size, prompt=L, output=L, service=service))
    assert set(res.at_bound) >= {"per_context_token"} and all(res.params[k] == 0.0 for k in res.at_bound)
    assert res.model is not None and "at 0, the bound of the domain" in res.note


def test_a_fit_refuses_measured_times_beyond_a_sane_domain_naming_the_row():
    """DecodeModel.fit with a measured time of 1e300 s returned rmse = inf (the residuals' squares
    overflow; a length of 1e300 tokens overflowed the design): measured times stay within
    MAX_MEASURED_TIME (2**30 s, about 34 years: the top of the typical service times a run resolves),
    lengths and aggregates below 2**62 tokens, refused naming the column and the row."""
    from mbbatch.params import MAX_MEASURED_TIME
    from mbbatch.simulation import SCALE_RANGE

    assert MAX_MEASURED_TIME == SCALE_RANGE[1]
    size = np.array([1, 2, 4, 8, 16, 32] * 2)
    rows = dict(size=size, prompt=np.array([128.0, 256.0, 512.0] * 4), output=np.array([64.0] * 6 + [256.0] * 6))
    rows["service"] = 0.01 + 1e-4 * size * rows["output"]
    for model in (mb.DecodeModel, mb.IterationModel):
        assert math.isfinite(model.fit(rows, holdout=False).rmse)
        for col, value, match in (
                ("service", 1e300, r"column service must hold values in \[0, 1073741824\] \(s\); got "
                                   r"column service\[3\] = 1e\+300$"),
                ("service", 2.0 ** 31, r"column service must hold values in \[0, 1073741824\] \(s\); got "
                                       r"column service\[3\] = 2147483648\.0$"),
                ("prompt", 1e300, r"column prompt must hold values in \[0, 2\*\*62\) \(tokens\); got "
                                  r"column prompt\[3\] = 1e\+300$")):
            bad = {**rows, col: rows[col].astype(float).copy()}
            bad[col][3] = value
            with pytest.raises(ValueError, match=rf"^{model.__name__}\.fit: {match}"):
                model.fit(bad, holdout=False)


def test_a_robust_fit_flags_the_rows_that_contradict_the_rest():
    """A batch whose generation stopped early (its measured time a third of
    what its lengths take) pulls an ordinary fit off; ``robust=True`` flags
    it (and only it), lists it, and fits the rest as if it were not there."""
    true = IterationModel(setup=0.0, step=6e-3, prefill_per_token=8e-5, per_sequence=1e-4, per_context_token=6e-8)
    rng = np.random.default_rng(7)
    size, length = (a.ravel() for a in np.meshgrid([1, 2, 4, 8, 16, 32, 64], [128, 256, 512, 1024, 2048]))
    service = true.service_time(size=size, prompt=length, output=length) * np.exp(rng.normal(0, 0.01, size.size))
    bad = service.copy()
    bad[17] /= 3.0
    rows = dict(size=size, prompt=length, output=length)
    clean = IterationModel.fit({**rows, "service": service}, weights="relative")
    plain = IterationModel.fit({**rows, "service": bad}, weights="relative")
    robust = IterationModel.fit({**rows, "service": bad}, weights="relative", robust=True)
    assert plain.flagged == () and robust.flagged == (17,)
    assert "flagged" in str(robust) and robust.n == size.size - 1
    keep = np.arange(size.size) != 17
    trimmed = IterationModel.fit({k: v[keep] for k, v in {**rows, "service": bad}.items()}, weights="relative")
    assert robust.params == pytest.approx(trimmed.params, rel=1e-9, abs=1e-15)
    assert abs(robust.params["step"] / clean.params["step"] - 1) < abs(plain.params["step"] / clean.params["step"] - 1)
    # clean rows: nothing flagged
    assert IterationModel.fit({**rows, "service": service}, weights="relative", robust=True).flagged == ()
    with pytest.raises(TypeError, match="robust must be True or False"):
        IterationModel.fit({**rows, "service": service}, robust="yes")
