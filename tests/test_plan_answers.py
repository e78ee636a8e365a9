"""``petra plan answers``: the reviewers' questions from the committed H200 profile."""

import json
from pathlib import Path

from petra_core.cli import main

H200 = Path(__file__).resolve().parents[1] / "results/gpu/nvidia-h200/stage_profile.json"


def test_answers_record(tmp_path, capsys):
    out = tmp_path / "answers.json"
    argv = ["plan", "answers", "--profile", str(H200), "--clusters", "h100-sxm-node", "--methods", "petra,gpipe",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    a = json.loads(out.read_text())
    piped = [r for r in a["rows"] if r["layout"] == "pipeline" and r["arch"] == "revnet18" and r["method"] == "petra"]
    assert [r["devices"] for r in piped] == list(range(1, 9)) and all(r["replicas"] == 1 for r in piped)
    assert piped[-1]["speedup"] > 1 and piped[0]["speedup"] == 1
    rows = [r for r in a["rows"] if r["arch"] == "revnet50" and r["method"] == "gpipe"]
    best = {r["devices"]: r for r in rows if r["layout"] == "best"}
    one = {r["devices"]: r for r in rows if r["layout"] == "pipeline"}
    assert set(best) == set(one) == set(range(1, 9))
    assert all(best[g]["samples_per_s"] >= one[g]["samples_per_s"] * (1 - 1e-9) for g in best)  # one pipeline: R = 1
    best = list(best.values())
    assert "phases of backprop" in best[0]["profile"] and best[0]["k"] == 4
    assert {(f["arch"], f["method"]) for f in a["fewest"]} == {
        (m, x) for m in ("revnet18", "revnet50") for x in ("petra", "gpipe")
    }
    assert [x["method"] for x in a["largest"]] == ["petra", "petra"]  # per model family; gpipe's is backprop's
    assert a["provenance"]["revision"] and a["missing"] == []
    gpipe = [f for f in a["fewest"] if f["method"] == "gpipe"]
    assert all((f["microbatch"], f["k"]) == (64, 4) for f in gpipe)  # 256 = 4 microbatches of 64
