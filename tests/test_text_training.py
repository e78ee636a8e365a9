"""``petra train dataset=botchan`` end to end: a character-level language model through the run layer.

The model is a tiny char-LM family of this file's own (token embedding, a Linear block, LM head),
on the contract of the character-level GPT family (``families/transformers.py``): (B, T) token
ids in, (B, T, V) logits out, loss and metrics per token (loss, bits per character, perplexity,
accuracy). ``ARCHS`` lists the archs trained here: the tiny one and the real ``revgpt``.
"""

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import untimed
from torch import nn

from petra_core.cli import main
from petra_core.data import prepare
from petra_core.data.text import BOTCHAN_SHIPPED
from petra_core.families.family import ModelFamily
from petra_core.families.registry import FAMILIES, register_family
from petra_core.models.stage import Stage
from petra_core.run.config import TEXT_CONTEXTS, ConfigError, RunConfig

ARCHS = ["tinylm", "revgpt"]


class TokenEmbedding(Stage):
    kind = "S"

    def __init__(self, vocab: int, width: int, context: int):
        super().__init__()
        self.tokens, self.pos = nn.Embedding(vocab, width), nn.Parameter(torch.zeros(context, width))

    def forward(self, ids):
        return self.tokens(ids) + self.pos[: ids.shape[-1]]


class MLPBlock(Stage):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x):
        return x + F.gelu(self.fc(self.norm(x)))


class LMHead(Stage):
    kind = "H"

    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, x):
        return self.fc(self.norm(x))


class TinyLM(ModelFamily):
    """A char-LM family on the character-level GPT's contract, small enough to train in seconds."""

    name = "tiny-char-lm (test)"
    train_sums = ("correct", "tokens")
    eval_names = ("test_loss", "test_bpc", "test_ppl", "test_acc")
    data_kind = "text"

    @property
    def archs(self):
        return ("tinylm",)

    def build(self, arch, *, num_classes, stem=None, size="cpu", width=None, context=None, aux_head=None):
        width, context = width or 16, context or TEXT_CONTEXTS[size]
        stages = [TokenEmbedding(num_classes, width, context), MLPBlock(width), MLPBlock(width)]
        return self.staged(arch, [*stages, LMHead(width, num_classes)])

    def loss(self, output, targets):
        return F.cross_entropy(output.float().flatten(0, 1), targets.flatten())

    def minibatch_sums(self, output, targets):
        correct = (output.argmax(-1) == targets).sum()
        return torch.stack([correct, correct.new_full((), targets.numel())])

    def train_record(self, loss_sum, sums, n):
        correct, tokens = sums
        loss = loss_sum / n
        return {"train_loss": loss, "train_bpc": loss / math.log(2), "train_ppl": math.exp(loss),
                "train_acc": 100 * correct / tokens}  # fmt: skip

    def eval_sums(self, output, targets):
        return {
            "loss": float(F.cross_entropy(output.float().flatten(0, 1), targets.flatten(), reduction="sum")),
            "correct": float((output.argmax(-1) == targets).sum()),
            "tokens": float(targets.numel()),
        }

    def eval_record(self, sums, n):
        loss = sums["loss"] / sums["tokens"]
        return {"test_loss": loss, "test_bpc": loss / math.log(2), "test_ppl": math.exp(loss),
                "test_acc": 100 * sums["correct"] / sums["tokens"]}  # fmt: skip

    def sample_input(self, batch, *, device=None, context):
        return torch.zeros(batch, context, dtype=torch.long, device=device)


@pytest.fixture(autouse=True)
def tiny_family():
    register_family(TinyLM())
    yield
    FAMILIES.pop(TinyLM.name)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    prepare("botchan", BOTCHAN_SHIPPED, root / "botchan")
    return root


def config(data_dir, arch="tinylm", **overrides):
    """Tiny: 2 epochs of 6 minibatches of 8 windows of 16 characters, one thread."""
    base = dict(dataset="botchan", arch=arch, method="backprop", data_dir=str(data_dir), context=16,
                windows_per_epoch=48, batch_size=8, eval_batch_size=512, epochs=2, optimizer="adamw",
                base_lr=0.01, scale_lr=False, weight_decay=0.0, threads=1, progress=False)  # fmt: skip
    return [f"{k}={v}" for k, v in {**base, **overrides}.items()]


def read(run_dir, name):
    return json.loads((run_dir / name).read_text())


@pytest.mark.parametrize("arch", ARCHS)
def test_petra_train_on_botchan_records_the_families_text_metrics(arch, data_dir, tmp_path, capsys):
    assert main(["train", *config(data_dir, arch), "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr()
    assert "nats/char" in out.out and "bits/char" in out.out and "top-1" not in out.out
    epoch_lines = [line for line in out.err.splitlines() if line.startswith("epoch ")]
    assert len(epoch_lines) == 2 and all("test_bpc" in line and "train_bpc" in line for line in epoch_lines)
    assert all(" windows/s, ETA " in line for line in epoch_lines) and "windows/s" in out.out.splitlines()[-1]
    history = read(tmp_path / "run", "history.json")
    assert [h["epoch"] for h in history] == [1, 2]
    assert {"train_loss", "train_bpc", "train_ppl", "train_acc", "test_loss", "test_bpc", "test_ppl"} <= set(history[0])
    assert history[1]["test_loss"] < history[0]["test_loss"] < math.log(78)  # it learns, past uniform guessing
    metrics = read(tmp_path / "run", "metrics.json")
    assert "top1" not in metrics and "top1_bn_reestimated" not in metrics  # no batch norm to re-estimate
    assert metrics["test_bpc"] == pytest.approx(metrics["test_loss"] / math.log(2))
    assert metrics["best_test_loss"] == history[1]["test_loss"] and metrics["optimizer_steps"] == 12
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["size"] == "cpu" and saved["context"] == 16 and saved["width"] is None


def test_a_text_run_stopped_mid_epoch_resumes_bit_for_bit(data_dir, tmp_path):
    from conftest import whole_and_resumed

    whole, cut = whole_and_resumed(config(data_dir), tmp_path, signal_at="0:8:SIGINT")
    for name in ("history.json", "metrics.json"):
        assert untimed(read(whole, name) if name == "metrics.json" else read(whole, name)) == untimed(read(cut, name))
    a, b = (torch.load(d / "checkpoint.pt", weights_only=False) for d in (whole, cut))
    assert a["model"].keys() == b["model"].keys() and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_petra_results_shows_text_metrics_for_text_runs(data_dir, tmp_path, capsys):
    profile = tmp_path / "text.yaml"
    train = dict(item.split("=", 1) for item in config(data_dir, epochs=1))
    train = {k: yaml.safe_load(v) for k, v in train.items() if k not in ("arch", "method")}
    grid_block = {"arch": ["tinylm"], "method": ["backprop"], "seed": [0, 1]}
    profile.write_text(yaml.safe_dump({"profile": "text", "train": train, "grid": [grid_block]}))
    from petra_core.workflow import grid

    for run in grid.runs(grid.load_profile(profile)):
        assert (
            main(["train", "--profile", str(profile), *run.overrides(), "--run-dir", str(tmp_path / run.directory)])
            == 0
        )
    assert run.directory.parts[-2] == "tinylm-cpu"  # the arch's own width, the text size
    out = tmp_path / "results"
    assert main(["results", "--profile", str(profile), "--root", str(tmp_path), "--out", str(out)]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("botchan-tinylm-backprop-k1")]
    assert re.fullmatch(
        r"\S+: test loss \S+ ± \S+ nats/char, \S+ ± \S+ bits/char, perplexity \S+ ± \S+ \(n = 2\)", line
    )
    import pandas as pd

    results, summary = pd.read_csv(out / "results.csv"), pd.read_csv(out / "summary.csv")
    assert len(results) == 2 and results.test_bpc.notna().all() and results.top1.isna().all()
    assert {"test_bpc_mean", "test_ppl_mean", "test_loss_mean"} <= set(summary.columns)
    assert summary.test_bpc_mean[0] == pytest.approx(results.test_bpc.mean())
    (leaf,) = [json.loads(p.read_text()) for p in (out / "metrics").glob("*.json")]
    assert set(leaf) == {"n", "test_loss_mean", "test_loss_std", "test_bpc_mean", "test_bpc_std"} and leaf["n"] == 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(dataset="synthetic", arch="revnet18", context=16), "context=16 is only used by text datasets"),
        (dict(dataset="synthetic", arch="revnet18", size="gpu", context=None), "size='gpu' is only used by text"),
        (dict(arch="revnet18"), "arch='revnet18' reads images, dataset='botchan' holds text; allowed archs: "),
        (dict(dataset="synthetic", context=None), "arch='tinylm' reads text, dataset='synthetic' holds images"),
        (dict(size="tpu"), "size='tpu' is not allowed; allowed: None, cpu, gpu"),
        (dict(context=0), "context=0 must be >= 1"),
        (dict(subset=100), "subset=100 subsets an image dataset; dataset='botchan' is text"),
        (dict(blocks_per_stage=0), "blocks_per_stage=0 must be >= 1"),
        (dict(blocks_per_stage=2), "blocks_per_stage=2 groups a transformer's blocks into stages; arch='tinylm' has"),
        (
            dict(dataset="synthetic", arch="revnet18", context=None, windows_per_epoch=None, blocks_per_stage=2),
            "arch='revnet18' has a stage per block",
        ),
    ],
)
def test_text_keys_are_checked_in_one_line(data_dir, overrides, message):
    values = {**dict(item.split("=", 1) for item in config(data_dir)), **overrides}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RunConfig.load(overrides=[f"{k}={'null' if v is None else v}" for k, v in values.items()])


def test_blocks_per_stage_cuts_the_gpt_into_fewer_stages(data_dir, tmp_path, capsys):
    """``blocks_per_stage=2``: revgpt's 4 blocks in 2 stages (stem, 2 reversible stages, head), trained
    by PETRA through the run layer; a split that does not divide the depth is one line."""
    tiny = config(data_dir, "revgpt", method="petra", width=16, epochs=1)
    assert main(["train", *tiny, "blocks_per_stage=2", "--run-dir", str(tmp_path / "run")]) == 0
    metrics = read(tmp_path / "run", "metrics.json")
    assert (metrics["stages"], metrics["stage_kinds"]) == (4, "S R R H") and math.isfinite(metrics["test_loss"])
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["blocks_per_stage"] == 2
    capsys.readouterr()
    assert main(["train", *tiny, "blocks_per_stage=3", "--run-dir", str(tmp_path / "bad")]) != 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "petra: error: blocks_per_stage 3 does not divide depth 4; allowed: 1, 2, 4"
    )


def test_text_defaults_are_written_into_the_config(data_dir):
    cfg = RunConfig.load(overrides=["dataset=botchan", "arch=tinylm", f"data_dir={data_dir}", "method=backprop"])
    assert (cfg.size, cfg.context, cfg.width, cfg.windows_per_epoch) == ("cpu", 64, None, None)
    gpu = RunConfig.load(overrides=["dataset=botchan", "arch=tinylm", f"data_dir={data_dir}", "size=gpu"])
    assert gpu.context == 256
    image = RunConfig.load(overrides=[])  # an image run's config is as before: width 64, no text keys set
    assert (image.width, image.size, image.context) == (64, None, None)


def test_the_contexts_agree_with_the_character_lm_sizes():
    transformers = pytest.importorskip("petra_core.families.transformers")  # merged from the models part
    assert {size: shape["context"] for size, shape in transformers.LM_SIZES.items()} == TEXT_CONTEXTS


def test_a_text_population_is_evaluated_by_its_family(data_dir, tmp_path):
    """Two data-parallel replicas (dp evaluates its population): every replica's test loss and the
    weight average's text record, no top-1, ensemble or batch-norm statistics."""
    run = tmp_path / "run"
    assert main(["train", *config(data_dir, epochs=1, replicas=2, evaluated_model="both"), "--run-dir", str(run)]) == 0
    metrics = read(run, "metrics.json")
    population = metrics["population"]
    assert population["replicas"] == 2 and len(population["members_test_loss"]) == 2
    assert population["members_test_loss"][0] == metrics["test_loss"]  # replica 0 is the run's model
    assert {"average_test_loss", "average_test_bpc", "average_test_ppl", "average_test_acc"} <= set(population)
    assert metrics["average_test_bpc"] == population["average_test_bpc"]  # evaluated_model=both
    assert not any("top1" in key for key in (*metrics, *population))


def test_petra_results_lines_of_image_runs_keep_top1():
    """The committed cpu profile's groups (image classifiers) are printed with top-1 and top-5."""
    import pandas as pd

    from petra_core.report.results import summary_lines

    summary = pd.read_csv(Path(__file__).resolve().parents[1] / "results" / "cpu" / "summary.csv")
    lines = summary_lines(summary)
    assert len(lines) == len(summary) and all(" %, top-5 " in line and "nats/char" not in line for line in lines)
    backprop = next(line for line in lines if line.startswith("cifar10-revnet18-w16-backprop-k1:"))
    row = summary[(summary.arch == "revnet18") & (summary.method == "backprop")].iloc[0]
    assert backprop.startswith(f"cifar10-revnet18-w16-backprop-k1: top-1 {row.top1_mean:.2f} ± {row.top1_std:.2f} %")


@pytest.mark.slow
def test_revgpt_on_two_ranks_matches_the_simulator(data_dir, tmp_path):
    """``petra train --ranks 2`` (gloo) of PETRA on the character-level GPT ends with the simulator's
    run bit for bit (the ranks import the registered families, not this file's: hence revgpt)."""
    pytest.importorskip("petra_core.families.transformers")  # merged from the models part
    args = config(data_dir, "revgpt", method="petra", context=32, width=32, windows_per_epoch=64, batch_size=16)
    sim, ranks = tmp_path / "sim", tmp_path / "ranks"
    assert main(["train", *args, "--run-dir", str(sim)]) == 0
    assert main(["train", *args, "--ranks", "2", "--run-dir", str(ranks)]) == 0
    for name in ("history.json", "metrics.json"):
        assert untimed(read(sim, name)) == untimed(read(ranks, name))
    assert read(ranks, "env.json")["world_size"] == 2
