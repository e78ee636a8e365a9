"""Transformer families: a RevViT and its twin ViT on images, a reversible character-level GPT and its
twin on text (the blocks, stems and heads: ``models/transformer.py``).

* :class:`VisionTransformers` (``revvit``, ``vit``): image classification, the image family's
  objective and metrics (top-1 in training; loss, top-1, top-5 at evaluation). The defaults are
  the minREV recipe's shape: embedding 128, depth 6, 8 heads, patch 4 on 32x32 images (64 tokens).
* :class:`CharacterLM` (``revgpt``, ``gpt``): next-character prediction on (B, T) token ids, logits
  (B, T, V); loss, bits per character, perplexity and token accuracy. Sizes are nanoGPT's
  character-level Shakespeare models: ``cpu`` 4 layers, 4 heads, 128-dim, context 64; ``gpu`` 6
  layers, 6 heads, 384-dim, context 256.

Cut: stem, one stage per ``blocks_per_stage`` blocks, head. A reversible model and its twin have
the same parameters, stage by stage (``models/transformer.py`` says why).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..models.aux_heads import TOKEN_AUX_HEADS, TokenAuxHead
from ..models.spec_check import check_choice, check_int
from ..models.stage import Stage
from ..models.staged import StagedModel
from ..models.transformer import ClassifierHead, LMHead, PatchStem, TokenStem, block_stages
from ..precision import widen
from .family import ModelFamily
from .image import ImageClassification

LM_SIZES = {
    "cpu": dict(width=128, depth=4, heads=4, context=64),
    "gpu": dict(width=384, depth=6, heads=6, context=256),
}


def _with_aux_heads(
    stages: list[Stage], aux_head: str | None, *, width: int, num_classes: int, reversible: bool, per_token: bool
) -> list[Stage]:
    """``stages`` with an auxiliary head on each (local learning; ``models/aux_heads.py``)."""
    if aux_head is not None:
        check_choice("aux_head", aux_head, TOKEN_AUX_HEADS)
        for stage in stages:
            stage.aux = TokenAuxHead(width, num_classes, n_streams=2 if reversible else 1, per_token=per_token)
    return stages


class VisionTransformers(ImageClassification):
    """RevViT (``revvit``) and its twin ViT (``vit``) as image classifiers (the image family's objective)."""

    name = "vision-transformer"
    cuts_blocks_per_stage = True

    @property
    def archs(self) -> tuple[str, ...]:
        return ("revvit", "vit")

    def build(
        self,
        arch: str,
        *,
        num_classes: int,
        stem: str = "cifar",
        width: int = 128,
        depth: int = 6,
        heads: int = 8,
        patch: int = 4,
        image_size: int = 32,
        blocks_per_stage: int = 1,
        aux_head: str | None = None,
    ) -> StagedModel:
        """``arch`` on ``image_size``² images cut in ``patch``² patches; ``width`` is the embedding (per
        stream for ``revvit``). ``stem`` is ``"cifar"`` only (the patch embedding; it is what
        ``image_size`` and ``patch`` set). ``aux_head`` (``"linear"``): an auxiliary classifier on
        every stage but the head, for local learning."""
        check_choice("arch", arch, self.archs)
        check_choice("stem", stem, ("cifar",))
        check_int("num_classes", num_classes, 2)
        check_int("patch", patch)
        check_int("image_size", image_size)
        if image_size % patch:
            raise ValueError(f"image_size {image_size} is not a multiple of patch ({patch})")
        reversible = arch == "revvit"
        blocks = block_stages(
            reversible=reversible,
            width=width,
            depth=depth,
            heads=heads,
            causal=False,
            blocks_per_stage=blocks_per_stage,
        )
        stages = [PatchStem(width, patch, image_size, two_streams=reversible), *blocks]
        _with_aux_heads(stages, aux_head, width=width, num_classes=num_classes, reversible=reversible, per_token=False)
        return self.staged(arch, [*stages, ClassifierHead(width, num_classes)])


class CharacterLM(ModelFamily):
    """A character-level GPT, reversible (``revgpt``) or its twin (``gpt``): causal attention,
    next-character targets (B, T).

    The head's sums are the correct next-character predictions and the tokens of a minibatch.
    ``train_loss`` is Σ loss·n / n over the epoch's minibatches (n samples each; the engine's
    convention), the mean over tokens as long as every minibatch has the same T (a data source of
    fixed-length windows). Evaluation counts its own tokens.
    """

    name = "character-lm"
    data_kind = "text"  # token windows of a text source (petra_core/data/text.py)
    cuts_blocks_per_stage = True
    train_sums = ("correct", "tokens")
    eval_names = ("test_loss", "test_bpc", "test_ppl", "test_acc")

    @property
    def archs(self) -> tuple[str, ...]:
        return ("revgpt", "gpt")

    def build(
        self,
        arch: str,
        *,
        num_classes: int,
        stem: object = None,
        size: str = "cpu",
        width: int | None = None,
        depth: int | None = None,
        heads: int | None = None,
        context: int | None = None,
        blocks_per_stage: int = 1,
        aux_head: str | None = None,
    ) -> StagedModel:
        """``arch`` for a vocabulary of ``num_classes`` characters, of ``size`` (``cpu`` or ``gpu``,
        nanoGPT's); ``width``, ``depth``, ``heads``, ``context`` override the size's. ``stem`` is
        accepted and ignored (the token embedding is the only stem text has). ``aux_head``
        (``"linear"``): a per-token auxiliary head on every stage but the head, for local learning."""
        check_choice("arch", arch, self.archs)
        check_choice("size", size, tuple(LM_SIZES))
        check_int("num_classes", num_classes, 2)
        given = dict(width=width, depth=depth, heads=heads, context=context)
        shape = {k: LM_SIZES[size][k] if v is None else v for k, v in given.items()}
        check_int("context", shape["context"])
        reversible = arch == "revgpt"
        blocks = block_stages(
            reversible=reversible,
            width=shape["width"],
            depth=shape["depth"],
            heads=shape["heads"],
            causal=True,
            blocks_per_stage=blocks_per_stage,
        )
        stages = [TokenStem(num_classes, shape["width"], shape["context"], two_streams=reversible), *blocks]
        _with_aux_heads(
            stages, aux_head, width=shape["width"], num_classes=num_classes, reversible=reversible, per_token=True
        )
        return self.staged(arch, [*stages, LMHead(shape["width"], num_classes)])

    def loss(self, output: Tensor, targets: Tensor) -> Tensor:
        """Mean cross-entropy over the B·T positions (bf16 logits: in float32)."""
        return F.cross_entropy(widen(output).flatten(0, 1), targets.flatten())

    def minibatch_sums(self, output: Tensor, targets: Tensor) -> Tensor:
        correct = (output.argmax(-1) == targets).sum()
        return torch.stack([correct, correct.new_full((), targets.numel())])

    def train_record(self, loss_sum: float, sums: Sequence[float], n: int) -> dict:
        correct, tokens = sums
        return {**_text_metrics("train", loss_sum / n), "train_acc": 100 * correct / tokens}

    def eval_sums(self, output: Tensor, targets: Tensor) -> Mapping[str, float]:
        return {
            "loss": float(F.cross_entropy(widen(output).flatten(0, 1), targets.flatten(), reduction="sum")),
            "correct": float((output.argmax(-1) == targets).sum()),
            "tokens": float(targets.numel()),
        }

    def eval_record(self, sums: Mapping[str, float], n: float) -> dict:
        """Test loss (nats/char), bits per char, perplexity and token accuracy (%), per token (``n``,
        the samples, is not used)."""
        tokens = sums["tokens"]
        return {**_text_metrics("test", sums["loss"] / tokens), "test_acc": 100 * sums["correct"] / tokens}

    def sample_input(self, batch: int, *, device=None, context: int) -> Tensor:
        return torch.zeros(batch, context, dtype=torch.long, device=device)


def _text_metrics(prefix: str, loss: float) -> dict:
    """Loss in nats per character, bits per character (loss / ln 2) and perplexity (e^loss; inf past
    float range)."""
    try:
        ppl = math.exp(loss)
    except OverflowError:
        ppl = math.inf
    return {f"{prefix}_loss": loss, f"{prefix}_bpc": loss / math.log(2), f"{prefix}_ppl": ppl}


VISION_TRANSFORMERS = VisionTransformers()
CHARACTERS = CharacterLM()
