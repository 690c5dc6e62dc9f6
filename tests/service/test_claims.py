"""service/claims.py: the verdict rule against hand-worked cases and a naive interval, the claims file and
the doc tables, the spec's claim checks, and `layerlab claims doc --check`."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.claims import (
    VERDICTS,
    band_width,
    claims_json,
    claims_markdown,
    claims_table,
    estimate,
    is_failure,
    judge,
    read_claims,
    render_doc,
    verdict_comparison,
    verdict_value,
    welch,
)
from service.errors import SpecError
from service.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
LAYERLAB = Path(sys.executable).parent / "layerlab"
T975 = {1: 12.706204736, 2: 4.302652730, 4: 2.776445105}  # Student t at 0.975 (printed tables)


def trial(i: int, value: float, baseline: float = 0.5, **config: Any) -> dict[str, Any]:
    return {"trial_id": f"t{i}", "config": config, "metrics": {"accuracy": value, "baseline/majority": baseline}}


# --- the interval -------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[0.8, 0.9], [0.1, 0.2, 0.6], [1.0, 2.0, 3.0, 4.0, 10.0]])
def test_the_interval_is_the_textbook_t_interval(values: list[float]) -> None:
    e = estimate(values)
    n = len(values)
    half = T975[n - 1] * statistics.stdev(values) / math.sqrt(n)
    assert e.n == n and e.mean == pytest.approx(statistics.fmean(values))
    assert e.half == pytest.approx(half, rel=1e-8)


def test_non_finite_values_are_left_out_and_one_value_has_no_interval() -> None:
    e = estimate([0.5, math.nan, math.inf], ["a", "b", "c"])
    assert (e.n, e.mean, e.trials) == (1, 0.5, ("a",)) and math.isnan(e.half)
    assert estimate([]).n == 0


def test_welch_matches_the_formula() -> None:
    a, b = estimate([1.0, 2.0, 3.0]), estimate([0.0, 0.5, 0.7, 0.2])
    d, half = welch(a, b)
    va, vb = a.std**2 / 3, b.std**2 / 4
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 3)
    from scipy.stats import t

    assert d == pytest.approx(a.mean - b.mean)
    assert half == pytest.approx(t.ppf(0.975, df) * math.sqrt(va + vb))


# --- value claims -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "baseline", "mode", "paper", "verdict"),
    [
        ([], 0.5, "max", 0.9, "not measured"),
        ([0.95], 0.5, "max", 0.9, "measured"),  # one seed: no interval
        ([0.95, 0.96], 0.5, "max", 0.9, "measured"),  # two seeds: below the 3 a verdict needs
        ([0.52, 0.55, 0.50], 0.5, "max", 0.9, "not learned"),  # 0.523 ± 0.062: not above 0.5
        ([0.40, 0.41, 0.39], 0.5, "max", 0.9, "not learned"),  # below a policy that reads nothing
        ([0.895, 0.90, 0.905], 0.5, "max", 0.9, "reproduced"),  # [0.888, 0.912] inside 0.9 ± 0.045
        ([0.88, 0.90, 0.92], 0.5, "max", 0.9, "inconclusive"),  # [0.850, 0.950] holds 0.9, wider than the band
        ([0.86, 0.865, 0.87], 0.5, "max", 0.9, "close"),  # [0.853, 0.877] misses 0.9, mean within 0.045
        ([0.60, 0.61, 0.62], 0.5, "max", 0.9, "differs"),
        ([0.60, 0.61, 0.62], 0.5, "max", None, "measured"),
        ([102.0, 103.0, 104.0], 400.0, "min", 103.0, "reproduced"),  # perplexity: lower is better
        ([390.0, 395.0, 400.0], 400.0, "min", 103.99, "not learned"),  # not below the unigram model's
    ],
)
def test_value_verdicts(values: list[float], baseline: float, mode: str, paper: float | None, verdict: str) -> None:
    band = band_width(paper) if paper is not None else math.nan
    got, why = verdict_value(estimate(values), baseline, mode, paper, band)
    assert got == verdict, why
    assert why


def test_a_missing_baseline_does_not_make_a_model_not_learned() -> None:
    assert verdict_value(estimate([0.895, 0.9, 0.905]), math.nan, "max", 0.9, 0.045)[0] == "reproduced"


def test_the_paper_inside_a_too_wide_interval_is_inconclusive_with_the_seeds_needed() -> None:
    """0.9 ± 0.124 (sd 0.05, n = 3) holds the paper's 0.9 but is wider than its band (± 0.045): the t
    half-width at sd 0.05 first falls below 0.045 at n = 8 (t(7) = 2.365: 0.0418; t(6) = 2.447: 0.0462)."""
    verdict, why = verdict_value(estimate([0.85, 0.90, 0.95]), 0.5, "max", 0.9, band_width(0.9))
    assert verdict == "inconclusive" and "about 8 seeds" in why, why


def test_the_default_band_is_five_percent_and_two_points_above_ninety_percent() -> None:
    assert band_width(0.5) == pytest.approx(0.025) and band_width(200.0) == pytest.approx(10.0)
    assert band_width(0.9803, unit="fraction") == pytest.approx(0.02)  # not 0.049
    assert band_width(95.62, unit="percent") == pytest.approx(2.0)
    assert band_width(0.85, unit="fraction") == pytest.approx(0.0425)  # not above 90%: 5%
    assert band_width(0.9803, tolerance=0.1, unit="fraction") == pytest.approx(0.09803)  # the claim's own band
    assert band_width(0.5, tolerance_abs=0.01) == 0.01


# --- comparison claims --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "paper_diff", "verdict"),
    [
        ([0.90, 0.91, 0.92], [0.80, 0.81, 0.82], 0.05, "reproduced"),  # the paper's sign, interval clear of 0
        ([0.80, 0.81, 0.82], [0.90, 0.91, 0.92], 0.05, "opposite"),
        ([0.80, 0.90, 0.85], [0.84, 0.86, 0.82], 0.02, "inconclusive"),  # holds 0 (and the paper's 0.02)
        ([0.80, 0.82, 0.81], [0.80, 0.82, 0.81], 0.5, "inconclusive"),  # no difference seen: holds 0
        ([0.90, 0.91, 0.92], [0.80, 0.81, 0.82], 0.0, "differs"),  # the paper reports none, ours excludes 0
        ([0.90, 0.91, 0.92], [0.45, 0.5, 0.48], 0.05, "not learned"),  # the other arm is below the baseline
        ([0.90], [0.80, 0.81, 0.82], 0.05, "measured"),
        ([0.90, 0.91], [0.80, 0.81, 0.82], 0.05, "measured"),  # n = 2 on one side
    ],
)
def test_comparison_verdicts(a: list[float], b: list[float], paper_diff: float, verdict: str) -> None:
    got, why, d, _ = verdict_comparison(estimate(a), estimate(b), 0.5, 0.5, "max", paper_diff)
    assert got == verdict, why
    assert d == pytest.approx(statistics.fmean(a) - statistics.fmean(b))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=0, max_size=6),
    st.floats(0, 1),
    st.one_of(st.none(), st.floats(0.01, 1)),
    st.sampled_from(["min", "max"]),
)
def test_every_value_claim_gets_a_verdict_and_below_baseline_is_never_reproduced(
    values: list[float], baseline: float, paper: float | None, mode: str
) -> None:
    e = estimate(values)
    verdict, _ = verdict_value(e, baseline, mode, paper, band_width(paper) if paper else math.nan)
    assert verdict in VERDICTS
    band = band_width(paper) if paper else math.nan
    failure = is_failure(paper, baseline, mode, band)  # the paper's own value is no better than the baseline
    worse = e.n >= 3 and not failure and (e.mean <= baseline if mode == "max" else e.mean >= baseline)
    if worse:
        assert verdict == "not learned"
    if e.n < 3:
        assert verdict in ("measured", "not measured")
    if verdict == "reproduced":
        assert paper is not None and paper - band_width(paper) <= e.low and e.high <= paper + band_width(paper)


def test_a_comparison_whose_interval_holds_zero_is_inconclusive_with_the_seeds_needed() -> None:
    verdict, why, d, half = verdict_comparison(
        estimate([0.80, 0.90, 0.85]), estimate([0.84, 0.86, 0.82]), 0.5, 0.5, "max", 0.02
    )
    assert verdict == "inconclusive" and abs(d) <= half and "seeds a side" in why, why


# --- judging a sweep, the files and the doc -----------------------------------------------------

CLAIMS = [
    {"id": "mean-solves", "text": "mean solves XOR", "metric": "accuracy", "where": {"psi": "mean"}, "paper": 1.0,
     "baseline": "baseline/majority"},
    {"id": "mean-vs-min", "text": "mean beats min", "metric": "accuracy", "where": {"psi": "mean"},
     "versus": {"psi": "min"}, "paper": 1.0, "paper_versus": 0.6, "baseline": "baseline/majority"},
]  # fmt: skip
TRIALS = [
    trial(0, 1.0, psi="mean", seed=0),
    trial(1, 1.0, psi="mean", seed=1),
    trial(2, 1.0, psi="mean", seed=2),
    trial(3, 0.5, psi="min", seed=0),
    trial(4, 0.75, psi="min", seed=1),
    trial(5, 0.6, psi="min", seed=2),
]


def test_judge_selects_the_condition_and_pools_its_seeds() -> None:
    rows = judge(CLAIMS, TRIALS, {"accuracy": "max", "baseline/majority": "max"})
    assert rows[0]["ours"]["trials"] == ["t0", "t1", "t2"] and rows[0]["verdict"] == "reproduced"
    assert rows[0]["baseline"] == {"metric": "baseline/majority", "value": 0.5}
    assert rows[1]["ours_versus"]["values"] == [0.5, 0.75, 0.6] and rows[1]["verdict"] == "not learned"


def test_a_claim_naming_a_weaker_baseline_is_judged_against_the_stronger_one() -> None:
    """The claim names the unigram model; the trials also report the bigram model (the task declares both):
    perplexity 100 ± 2 beats the unigram's 400, not the bigram's 80."""
    trials = [
        {"trial_id": f"t{i}", "config": {"seed": i}, "metrics": {"ppl": v, "baseline/uni": 400.0, "baseline/bi": 80.0}}
        for i, v in enumerate([98.0, 100.0, 102.0])
    ]
    claim = {"id": "lm", "metric": "ppl", "paper": 100.0, "baseline": "baseline/uni"}
    modes = {"ppl": "min", "baseline/uni": "min", "baseline/bi": "min"}
    [row] = judge([claim], trials, modes, {"ppl": ("baseline/uni", "baseline/bi")})
    assert row["verdict"] == "not learned" and row["baseline"] == {"metric": "baseline/bi", "value": 80.0}
    assert row["baselines"] == {"baseline/uni": 400.0, "baseline/bi": 80.0}
    # The same with no task declaration: the claim's own list is weighed whole.
    [named] = judge([{**claim, "baselines": ["baseline/bi"]}], trials, modes)
    assert named["verdict"] == "not learned" and named["baseline"]["metric"] == "baseline/bi"
    table = claims_table({"claims": [row], "sweep": {}})
    assert "80 (baseline/bi; strongest of 2)" in table


def test_pooled_trials_that_differ_in_more_than_seeds_get_no_verdict() -> None:
    trials = [trial(i, 1.0, psi="mean", seed=i, width=w) for i, w in enumerate([4, 8, 16])]
    [row] = judge(CLAIMS[:1], trials, {"accuracy": "max", "baseline/majority": "max"})
    assert row["verdict"] == "measured" and "differ in width" in row["why"], row["why"]


def test_claims_file_round_trip_and_table() -> None:
    rows = judge(CLAIMS, TRIALS, {"accuracy": "max", "baseline/majority": "max"})
    sweep = {"id": 7, "name": "xor-claims", "task": "tversky.xor", "parent_run_id": "abc", "finished_at": "now"}
    doc = read_claims(claims_json(sweep, rows))
    md = claims_markdown(doc).decode()
    assert "| mean solves XOR | psi=mean | accuracy (higher is better) | 1 ± 0.05 | 1 ± 0 (n = 3) |" in md
    assert "**not learned**" in md and "parent run `abc`" in md and "The rule:" in md


def test_read_claims_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="not JSON"):
        read_claims(b"{", "x.json")
    with pytest.raises(ValueError, match="format 3"):
        read_claims(json.dumps({"format": 3}), "x.json")
    with pytest.raises(ValueError, match="format 1, this layerlab reads format 2; judge it again"):
        read_claims(json.dumps({"format": 1}), "x.json")
    with pytest.raises(ValueError, match="lacks 'claims'"):
        read_claims(json.dumps({"format": 2, "sweep": {}}), "x.json")


def test_render_doc_fills_only_its_blocks_and_names_missing_files() -> None:
    rows = judge(CLAIMS[:1], TRIALS, {"accuracy": "max", "baseline/majority": "max"})
    doc = read_claims(claims_json({"name": "a"}, rows))
    text = "intro\n<!-- claims:a -->\nold\n<!-- /claims:a -->\nmiddle\n<!-- claims:b -->\n<!-- /claims:b -->\n"
    new, missing = render_doc(text, {"a": doc})
    assert missing == ["b"] and new.startswith("intro\n<!-- claims:a -->\n| claim |")
    assert "old" not in new and new.endswith("middle\n<!-- claims:b -->\n<!-- /claims:b -->\n")
    assert render_doc(new, {"a": doc})[0] == new  # idempotent


def test_cli_doc_writes_then_checks(tmp_path: Path) -> None:
    rows = judge(CLAIMS, TRIALS, {"accuracy": "max", "baseline/majority": "max"})
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "xor-claims.json").write_bytes(claims_json({"name": "xor-claims"}, rows))
    document = tmp_path / "fidelity.md"
    document.write_text("# F\n<!-- claims:xor-claims -->\n<!-- /claims:xor-claims -->\n")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(LAYERLAB), "claims", "doc", str(document), *args], capture_output=True, text=True)

    stale = run("--check")
    assert stale.returncode == 1 and "differ" in stale.stderr and "+| mean solves XOR" in stale.stdout
    assert run().returncode == 0 and "**reproduced**" in document.read_text()
    assert run("--check").returncode == 0
    (tmp_path / "claims" / "xor-claims.json").rename(tmp_path / "claims" / "other.json")
    wrong = run("--check")
    assert wrong.returncode == 1 and "name the file xor-claims.json" in wrong.stderr


def test_the_repository_doc_is_the_output_of_its_claims_files() -> None:
    """docs/fidelity.md's claims tables are exactly what `layerlab claims doc` makes from docs/claims/."""
    out = subprocess.run(
        [str(LAYERLAB), "claims", "doc", str(ROOT / "docs" / "fidelity.md"), "--check"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


# --- the spec -----------------------------------------------------------------------------------

SPEC = """
name: xor-claims
task: tversky.xor
metric: {name: accuracy}
params: {steps: 10, report_every: 5}
space: {intersection: {grid: [product, mean]}, seed: {grid: [0, 1]}}
claims:
"""


def errors_of(claims: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(SPEC + claims)
    return info.value.errors


def test_a_valid_claim_parses() -> None:
    spec = parse_spec(
        SPEC + "  - {id: a, text: t, metric: accuracy, where: {intersection: mean}, paper: 1.0, "
        "baseline: baseline/majority}\n"
    )
    assert spec.claims[0].where == {"intersection": "mean"} and spec.claims[0].tolerance is None
    assert spec.claims[0].replicates == ["seed"]


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        ("{id: a, text: t, metric: loss2}", "claims[0].metric: task tversky.xor reports loss, accuracy"),
        ("{id: a, text: t, metric: accuracy, baseline: nope}", "claims[0].baseline: task tversky.xor reports"),
        ("{id: a, text: t, metric: accuracy, where: {width: 3}}", "claims[0].where.width: the sweep sets no parameter"),
        (
            "{id: a, text: t, metric: accuracy, where: {intersection: min}}",
            "claims[0].where.intersection: no trial of this sweep has 'min'; its values: 'product', 'mean'",
        ),
        ("{id: a, text: t, metric: accuracy, versus: {seed: 0}, paper: 1}", "needs both paper and paper_versus"),
        ("{id: a, text: t, metric: accuracy, paper_versus: 1}", "give versus too"),
        ("{id: A B, text: t, metric: accuracy}", "claims[0].id"),
        ("{id: a, text: t, metric: accuracy, colour: red}", "claims[0].colour: unknown key; allowed keys: baseline"),
    ],
)
def test_bad_claims_are_refused_with_their_path(claim: str, message: str) -> None:
    errors = errors_of(f"  - {claim}\n")
    assert any(message in e for e in errors), errors


def test_a_claim_that_pools_settings_is_refused_naming_the_keys_that_differ() -> None:
    spec = SPEC.replace("space: {", "space: {features: {grid: [2, 4]}, lr: {loguniform: [0.01, 0.1]}, ")
    with pytest.raises(SpecError) as info:
        parse_spec(spec + "  - {id: a, text: t, metric: accuracy, where: {intersection: mean}}\n")
    assert info.value.errors == [
        "claims[0].where: pools trials that differ in features, lr, not only in seed; fix them in where, or "
        "declare independent replicates in `replicates`"
    ]
    fixed = "  - {id: a, text: t, metric: accuracy, where: {intersection: mean, features: 4, lr: 0.05}}\n"
    assert parse_spec(spec + fixed).claims[0].where["features"] == 4  # every searched key but the seed fixed
    replicated = (
        "  - {id: a, text: t, metric: accuracy, where: {intersection: mean}, replicates: [seed, features, lr]}\n"
    )
    assert parse_spec(spec + replicated).claims[0].replicates == ["seed", "features", "lr"]


def test_claim_ids_are_unique() -> None:
    errors = errors_of("  - {id: a, text: t, metric: accuracy}\n  - {id: a, text: u, metric: loss}\n")
    assert any("claims[1].id: 'a' is used twice" in e for e in errors), errors


def test_a_rate_over_one_trials_own_runs_is_judged_on_its_wilson_interval() -> None:
    """`count` names how many runs a one-trial rate is over: ours is then that rate with its 95% Wilson interval
    (jobs.stats.wilson_interval), and rules 3 and 4 apply to it as to a t interval."""
    from jobs.stats import wilson_interval

    def cell(rate: float, runs: int, **config: Any) -> dict[str, Any]:
        return {"trial_id": "t0", "config": config, "metrics": {"rate": rate, "runs": runs}}

    modes = {"rate": "max", "runs": "max"}
    base = {"metric": "rate", "count": "runs", "where": {"psi": "product"}}
    low, high = wilson_interval(2142, 4860)  # 0.441 of 4860: the XOR grid's product + substractmatch
    [near] = judge([{**base, "id": "a", "paper": 0.44}], [cell(2142 / 4860, 4860, psi="product")], modes)
    assert near["ours"]["low"] == pytest.approx(low) and near["ours"]["high"] == pytest.approx(high)
    assert near["ours"]["runs"] == 4860 and near["verdict"] == "reproduced"  # inside 0.44 ± 0.022
    [near_enough] = judge([{**base, "id": "b", "paper": 0.46}], [cell(2142 / 4860, 4860, psi="product")], modes)
    assert near_enough["verdict"] == "close"  # outside [0.427, 0.455], the mean within 0.023 of 0.46
    [far] = judge([{**base, "id": "b", "paper": 0.53}], [cell(2142 / 4860, 4860, psi="product")], modes)
    assert far["verdict"] == "differs"
    # Wilson is not empty at 0 ([0, 0.0008]): a band of 5% of 0 holds nothing, so the claim gives its own.
    [zero] = judge([{**base, "id": "c", "paper": 0.0}], [cell(0.0, 4860, psi="product")], modes | {"b": "max"})
    assert zero["verdict"] == "inconclusive"
    [zero] = judge([{**base, "id": "c", "paper": 0.0, "tolerance_abs": 0.001}], [cell(0.0, 4860, psi="product")], modes)
    assert zero["verdict"] == "reproduced"
    # Against a baseline: the low end must clear it; 3 of 10 runs ([0.108, 0.603]) does not clear 0.15.
    [weak] = judge(
        [{**base, "id": "d", "paper": 0.3, "baseline": "floor"}],
        [{"trial_id": "t0", "config": {"psi": "product"}, "metrics": {"rate": 0.3, "runs": 10, "floor": 0.15}}],
        modes | {"floor": "max"},
    )
    assert weak["verdict"] == "not learned"
    # Without `count`, one trial is still one seed; with two trials `count` is not used.
    [one] = judge([{"id": "e", "metric": "rate", "paper": 0.44}], [cell(0.44, 4860)], modes)
    assert one["verdict"] == "measured" and "runs" not in one["ours"]
    two = [cell(0.40, 4860), {**cell(0.46, 4860), "trial_id": "t1"}]
    [pooled] = judge([{"id": "f", "metric": "rate", "count": "runs", "paper": 0.43}], two, modes)
    assert pooled["ours"]["n"] == 2 and "runs" not in pooled["ours"]
    table = claims_table({"claims": [near], "sweep": {}})
    assert f"0.4407 [{low:.3g}, {high:.3g}] (4860 runs, Wilson)" in table


def test_count_must_be_a_metric_and_only_for_a_value_claim() -> None:
    assert any("claims[0].count: task tversky.xor reports" in e for e in errors_of(
        "  - {id: a, text: t, metric: accuracy, count: nope}\n"
    ))  # fmt: skip
    errors = errors_of("  - {id: a, text: t, metric: accuracy, count: loss, versus: {seed: 0}, paper: 1, "
                       "paper_versus: 0.5}\n")  # fmt: skip
    assert any("drop count or versus" in e for e in errors), errors


# --- which code made a claims file --------------------------------------------------------------


def test_table_names_the_code_of_the_run_when_the_file_has_it() -> None:
    rows = judge(CLAIMS[:1], TRIALS, {"accuracy": "max", "baseline/majority": "max"})
    sweep = {"id": 7, "name": "xor-claims", "task": "tversky.xor", "trials_finished": 4, "trials_total": 4}
    plain = claims_table(read_claims(claims_json(sweep, rows)))
    assert plain.rstrip().endswith("4 of 4 trials finished.")  # files exported before sweep.code: unchanged
    code = {"layerlab.version": "0.1.0", "layerlab.git_commit": "45f8b75fce8d" + "0" * 28,
            "layerlab.git_modified": "false"}  # fmt: skip
    made = claims_table(read_claims(claims_json({**sweep, "code": code}, rows)))
    assert made.rstrip().endswith("4 of 4 trials finished; code: layerlab 0.1.0 at commit 45f8b75fce8d, unmodified.")
    dirty = {**code, "layerlab.git_modified": "true", "layerlab.code_sha256": "ab" * 32}
    made = claims_table(read_claims(claims_json({**sweep, "code": dirty}, rows)))
    assert "at commit 45f8b75fce8d, with uncommitted changes, brought code abababababab." in made


def test_pull_copies_the_parent_runs_code_tags_into_the_file(tmp_path: Path) -> None:
    """A real MLflow store (sqlite): a parent run with provenance tags and summary/claims.json, pulled."""
    import mlflow

    from service.cli_claims import fetch_claims

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("xor-claims", artifact_location=(tmp_path / "artifacts").as_uri())
    tags = {"layerlab.version": "0.1.0", "layerlab.git_commit": "c" * 40, "layerlab.git_modified": "false",
            "layerlab.cluster_resources": "{}", "layerlab.torch_version": "2.14.1"}  # fmt: skip
    run = client.create_run(experiment, tags=tags)
    rows = judge(CLAIMS[:1], TRIALS, {"accuracy": "max", "baseline/majority": "max"})
    sweep = {"id": 1, "name": "xor-claims", "parent_run_id": run.info.run_id}
    client.log_text(run.info.run_id, claims_json(sweep, rows).decode(), "summary/claims.json")
    doc = fetch_claims(run.info.run_id, uri)
    assert doc["sweep"]["code"] == {k: tags[k] for k in ("layerlab.version", "layerlab.git_commit",
                                                         "layerlab.git_modified")}  # fmt: skip
    assert doc["claims"] == read_claims(claims_json(sweep, rows))["claims"]
    with pytest.raises(ValueError, match="has no summary/claims.json"):
        fetch_claims(client.create_run(experiment).info.run_id, uri)


def test_a_paper_value_that_is_itself_a_failure_is_not_asked_to_be_learned() -> None:
    """XOR's gmean converges in 0% of runs in the paper, the constant rule's 0: a run that also converges in 0%
    reproduces the failure instead of being 'not learned'; one that converges often differs."""
    cell = {"trial_id": "t0", "config": {}, "metrics": {"rate": 0.0, "runs": 4860, "baseline/zero": 0.0}}
    claim = {"id": "g", "metric": "rate", "count": "runs", "paper": 0.0, "tolerance_abs": 0.005}
    modes = {"rate": "max", "runs": "max", "baseline/zero": "max"}
    [failed] = judge([claim], [cell], modes, {"rate": ("baseline/zero",)})
    assert failed["verdict"] == "reproduced" and "learning is not asked" in failed["why"], failed["why"]
    [converged] = judge(
        [claim], [{**cell, "metrics": {**cell["metrics"], "rate": 0.3}}], modes, {"rate": ("baseline/zero",)}
    )
    assert converged["verdict"] == "differs"
