"""The random-spec fuzzer of ``make fuzz`` (tests/fuzz_sweeps.py): it draws
every spec parameter, and a few of its specs run and compare here, so it
cannot rot between fuzz runs."""

import random
from collections import Counter

import pytest

from mbbatch.sweeps.spec import SPEC_PARAMS

from . import fuzz_sweeps
from .fuzz_sweeps import _ranges, fuzz_one, main


def test_every_spec_parameter_has_a_sampler():
    """A parameter added to the spec table without a sampler here would
    never be fuzzed: this fails until it has one."""
    assert set(_ranges(random.Random(0))) == set(SPEC_PARAMS)


# (30 s of make test's budget, heavy: make thorough runs it, and make fuzz runs 100 such specs)
@pytest.mark.heavy
@pytest.mark.filterwarnings("ignore::mbbatch.arrivals.TraceTiledWarning")
def test_a_few_random_specs_run_and_agree_on_a_pool(tmp_path):
    """Six specs of seed 7: each is refused before a store exists, or runs,
    passes check_store and gives the same store on a 2-process pool; each
    that ran, mutated, is refused naming its file or runs."""
    R = random.Random(7)
    outcomes = Counter()
    for i in range(6):
        folder = tmp_path / str(i)
        folder.mkdir()
        _, done, _ = fuzz_one(R, folder, pool=1.0, mutate=1.0)
        outcomes.update(done)
    assert outcomes["ran"] >= 3 and outcomes["pool"] == outcomes["ran"], outcomes
    mutants = outcomes["mutant refused"] + outcomes["mutant ran"] + outcomes["mutant not run"]
    assert mutants == outcomes["ran"] and outcomes["mutant refused"] >= 1, outcomes


def test_the_command_line(tmp_path, capsys):
    """``python -m tests.fuzz_sweeps`` runs, counts and exits 0 when nothing fails."""
    assert main(["--specs", "2", "--seed", "5", "--pool", "0", "--kill", "0", "--dask", "0", "--multi", "0",
                 "--cli", "0", "--keep-failures", str(tmp_path / "kept")]) == 0
    assert capsys.readouterr().out.startswith("2 specs in ")
    assert not (tmp_path / "kept").exists()


def test_a_failure_is_kept_and_fails_the_run(tmp_path, monkeypatch, capsys):
    """A spec whose check raises is printed, its folder kept, and the exit
    status is 1."""
    def broken(R, folder, **kw):
        (folder / "s.toml").write_text("name = \"x\"\n")
        raise AssertionError("stores differ")

    monkeypatch.setattr(fuzz_sweeps, "fuzz_one", broken)
    assert main(["--specs", "1", "--keep-failures", str(tmp_path / "kept")]) == 1
    assert (tmp_path / "kept" / "seed0_spec0" / "s.toml").is_file()
    out = capsys.readouterr().out
    assert "FAILED" in out and "stores differ" in out and 'name = "x"' in out      # the spec, printed
    assert out.strip().endswith("1 failed")


def test_a_refusal_in_pythons_words_is_a_fault(tmp_path, monkeypatch):
    """A SpecError whose message is Python's own (as uniform service with
    optimal edges once was: "unsupported operand type(s) for /: 'float' and
    'NoneType'") fails the spec; a checker's refusal does not."""
    from mbbatch.sweeps.spec import SpecError

    def refuse(message):
        def check(spec):
            raise SpecError(f"s.toml: at grid point bins=1: {message}")
        return check

    monkeypatch.setattr(fuzz_sweeps, "check_points", refuse("bins must be in [1, inf); got 0"))
    assert fuzz_one(random.Random(0), tmp_path)[1] == ("refused",)
    monkeypatch.setattr(fuzz_sweeps, "check_points",
                        refuse("unsupported operand type(s) for /: 'float' and 'NoneType'"))
    with pytest.raises(AssertionError, match="refused with an internal error"):
        fuzz_one(random.Random(0), tmp_path)


def test_a_mutant_refused_without_naming_its_file_is_a_fault(tmp_path, monkeypatch):
    """The mutation contract: a SpecError must name the mutated spec's file."""
    from mbbatch.sweeps.spec import SpecError

    def refuse(spec):
        raise SpecError("at grid point bins=1: bins must be in [1, inf); got 0")

    spec = fuzz_sweeps.make_spec(random.Random(0), tmp_path)
    monkeypatch.setattr(fuzz_sweeps, "load_spec", lambda path: None)
    monkeypatch.setattr(fuzz_sweeps, "check_points", refuse)
    with pytest.raises(AssertionError, match="a refusal not naming the file"):
        fuzz_sweeps._check_mutated(random.Random(0), spec, tmp_path)


def test_a_spec_that_runs_too_long_is_a_failure(tmp_path, monkeypatch, capsys):
    """A spec whose checks outlast --timeout fails (as a capacity search
    that never ended once hung the fuzzer instead)."""
    import time

    def slow(R, folder, **kw):
        time.sleep(5)
        return "", ("ran",), ""

    monkeypatch.setattr(fuzz_sweeps, "fuzz_one", slow)
    assert main(["--specs", "1", "--timeout", "0.5", "--keep-failures", str(tmp_path / "kept")]) == 1
    assert "took more than 0.5 s" in capsys.readouterr().out
