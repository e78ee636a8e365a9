"""The comparison scripts of the replica rules against their official codes
(benchmarks/compare_official_{acco,cdp,papa}.py): what can be checked without the official code (it
is not shipped: licences, no network), and their committed records under results/official/."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "official"


def script(name: str):
    path = ROOT / "benchmarks" / f"compare_official_{name}.py"
    spec = importlib.util.spec_from_file_location(f"compare_official_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def record(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def per_step(result: dict) -> list[float]:
    """The per-step |diff| recomputed from the record's losses (which must agree with its summary)."""
    ours, theirs = result["losses"]["petra"], result["losses"]["official"]
    assert (len(ours), len(theirs)) == (result["losses_petra"], result["losses_official"])
    d = [abs(a - b) for a, b in zip(ours, theirs)]
    assert max(d) == result["max_abs_loss_diff"]
    return d


@pytest.mark.parametrize(
    "name,repo,needed",
    [
        ("acco", "edouardoyallon/acco", "trainer_decoupled.py"),
        ("cdp", "fournierlouis/Cyclic_Data_Parallelism", "cdp_utils.py"),
        ("papa", "SamsungSAILMontreal/PAPA", "models/combined.py"),
    ],
)
def test_a_directory_without_the_official_code_is_one_line_and_exit_2(tmp_path, capsys, name, repo, needed):
    with pytest.raises(SystemExit) as exit_:
        script(name).main(["--official", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(tmp_path) in err and repo in err and needed in err


def test_acco_matches_the_official_trainer_bit_for_bit_with_its_round0_bug_patched():
    r = record("acco")
    assert re.fullmatch(r"[0-9a-f]{40}", r["official_commit"])
    assert r["match"] is True and r["tolerance"] == 0.0 and r["setup"]["steps"] >= 20
    assert max(per_step(r["result"])) == 0.0 and r["result"]["max_abs_param_diff"] == 0.0
    assert r["result"]["losses_compared"] == r["result"]["losses_official"] == r["result"]["losses_petra"] > 0
    assert any("round 0" in change for change in r["change_to_official"])  # the patch is said


def test_acco_parts_from_the_official_code_where_the_record_says_why():
    """Left as it is, the round-0 bug parts the runs at the first loss computed at θ_1 (rank 0's
    second micro-batch of step 1); with k = 4 the official round 0 holds 1 + k/2 micro-batches, not
    petra's k (``first_round: official`` puts 1 + (k - 1)), so they part at step 0's last."""
    bug = record("acco_round0_bug")
    assert bug["match"] is False and bug["setup"]["keep_round0_bug"] is True
    assert not any("round 0" in change for change in bug["change_to_official"])
    assert bug["result"]["first_loss_beyond_tolerance"] == 6  # mb 3 of rank 0: step 1's second half
    assert max(per_step(bug["result"])[:6]) == 0.0 < per_step(bug["result"])[6]
    k4 = record("acco_k4")
    assert k4["match"] is False and k4["setup"]["k"] == 4
    per_rank_official = 1 + 2 * (2 * k4["setup"]["steps"] - 1)  # b0, then n = 2 per round but the last
    assert k4["result"]["losses_official"] == 2 * per_rank_official
    assert k4["result"]["losses_petra"] == 2 * k4["setup"]["steps"] * 4
    # per rank: round 0 (tentative) 1 gradient, round 1 (step 0's real round) 1 + 2, then 2 and 4
    assert k4["result"]["official_gradients_per_round"][:4] == [2, 6, 4, 8]
    assert record("acco")["result"]["official_gradients_per_round"] == [2, 4] * record("acco")["setup"]["steps"]


def test_the_official_dpu_applies_some_gradients_twice_and_petras_dpu_each_once():
    """petra's dpu (warm-up 0) and the official train_dpu compute at the same weights until the
    official code applies a gradient a second time: its odd rounds average 2 gradients per rank
    (the one applied the round before, again, and the new one), its even rounds 1."""
    r = record("dpu")
    assert r["match"] is False and r["setup"]["rule"] == "dpu" and r["setup"]["k"] == 1
    assert not any("round 0" in change for change in r["change_to_official"])
    x = r["result"]
    steps = r["setup"]["steps"]
    assert x["official_gradients_per_round"] == [2, 4] * (steps // 2)  # summed over the 2 ranks
    d = per_step(x)
    assert max(d[:6]) == 0.0 < d[6]  # steps 0-2 equal; step 3 computes after the first double application
    assert x["losses_official"] == 2 * (1 + steps) and x["losses_petra"] == 2 * steps


def test_acco_record_names_and_arguments():
    acco = script("acco")
    assert acco.record_name(acco.parse_args(["--official", "x"])) == "acco.json"
    assert acco.record_name(acco.parse_args(["--official", "x", "--rule", "dpu"])) == "dpu.json"
    assert acco.record_name(acco.parse_args(["--official", "x", "--keep-round0-bug", "--k", "4"])) == (
        "acco_round0_bug_k4.json"
    )
    assert acco.float32(2**-10) == 2**-10 and acco.float32(1e-3) != 1e-3  # why the default rate is 2^-10
    for bad in (["--k", "3"], ["--rule", "dpu", "--keep-round0-bug"], ["--rule", "dpu", "--k", "0"]):
        with pytest.raises(SystemExit):
            acco.parse_args(["--official", "x", *bad])


def test_cdp_matches_the_official_rules_bit_for_bit_and_the_average_it_evaluates():
    r = record("cdp")
    assert re.fullmatch(r"[0-9a-f]{40}", r["official_commit"])
    assert r["match"] is True and r["tolerance"] == 0.0 and r["setup"]["steps"] >= 20
    rules = {x["rule"]: x for x in r["rules"]}
    assert set(rules) == {"dp", "cdp1", "cdp2"}
    for x in rules.values():
        assert max(per_step(x)) == 0.0 and max(x["max_abs_param_diff_per_replica"]) == 0.0
        assert x["max_abs_average_diff"] == 0.0 and x["official_stages"] == r["setup"]["stages"]
        assert x["losses_compared"] == x["losses_official"] == x["losses_petra"] == 2 * r["setup"]["steps"]
    # not vacuous: the rules train differently, and cdp2's replicas drift apart (dp's do not)
    assert rules["cdp2"]["replicas_differ"] and not rules["dp"]["replicas_differ"]
    assert len({x["last_loss"]["official"] for x in rules.values()}) == 3


def test_cdps_flat_stages_compute_what_petras_stages_compute():
    """The official side's model (each stage's parameters one flat tensor, for the official split
    by parameter tensors) gives petra's model's output and gradients bit for bit."""
    cdp = script("cdp")
    petra, flat = cdp.make_model(), cdp.FlatStages(cdp.make_model())
    assert len(list(flat.parameters())) == len(petra)  # one parameter tensor per stage
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = petra(x)
    assert torch.equal(out, flat(x))
    out.square().sum().backward()
    flat(x).square().sum().backward()
    grads = [torch.nn.utils.parameters_to_vector([p.grad for p in stage.parameters()]) for stage in petra]
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, flat.parameters(), strict=True))


def test_papa_matches_the_official_ema_loop_with_the_official_phase_and_not_with_petras():
    r = record("papa")
    assert re.fullmatch(r"[0-9a-f]{40}", r["official_commit"])
    assert r["match"] is True and r["setup"]["phase"] == "official" and r["setup"]["steps"] >= 20
    x = r["result"]
    assert max(per_step(x)) <= r["tolerance"] == 1e-12 and max(x["max_abs_state_diff_per_network"]) == 0.0
    assert x["losses_compared"] == x["losses_official"] == x["losses_petra"] == r["setup"]["steps"]
    # i from 0 in each epoch of 10 steps, i % 4 == 0; the networks start apart and stay apart
    assert x["official_averages_after_steps"] == [0, 4, 8, 10, 14, 18] and x["networks_differ"]
    own = record("papa_petra_phase")
    assert own["match"] is False and own["setup"]["phase"] == "petra"
    assert own["result"]["first_loss_beyond_tolerance"] == 1  # the official code averaged after step 0


def test_papas_epoch_loader_gives_a_new_epoch_at_each_iter():
    papa = script("papa")
    loader = papa.EpochLoader(list(range(6)), 3)
    assert len(loader) == 3 and list(iter(loader)) == [0, 1, 2] and list(iter(loader)) == [3, 4, 5]
    args = papa.parse_args(["--official", "x"])
    assert papa.official_args(args).ema_alpha == 1 - args.rate == 0.9375  # exact in the official float32
    with pytest.raises(SystemExit):
        papa.parse_args(["--official", "x", "--steps", "15"])  # not whole epochs


def test_only_imports_that_fail_are_stubbed_and_the_losses_are_compared_step_by_step():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import official_common
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    marker = object()
    try:
        stubbed = official_common.stub_modules({"json": {"loads": marker}, "petra_not_installed.sub": {"x": marker}})
        assert stubbed == ["petra_not_installed.sub"]
        assert json.loads is not marker  # an installed module is left as it is
        assert sys.modules["petra_not_installed"].sub.x is marker
    finally:
        for name in ("petra_not_installed", "petra_not_installed.sub"):
            sys.modules.pop(name, None)
    d = official_common.diffs([1.0, 2.0, 3.0], [1.0, 2.5, 3.0], 0.1)
    assert (d["max_abs_loss_diff"], d["first_loss_beyond_tolerance"], d["losses_compared"]) == (0.5, 1, 3)
    assert official_common.diffs([1.0], [1.0, 2.0], 0.0)["losses_official"] == 2
