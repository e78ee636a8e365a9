"""One run's configuration: a typed, documented dataclass; YAML files and key=value overrides.

Unknown keys, wrong types and meaningless values are rejected before anything starts, with a
one-line message naming the key and what is allowed. ``petra train --help-config`` prints every
key with its default and description.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import re
import typing
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import yaml

_RANGES = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")
_POSITIVE = (
    "width",
    "k",
    "epochs",
    "batch_size",
    "eval_batch_size",
    "synthetic_train",
    "synthetic_test",
    "eval_every",
    "replicas",
    "subset",
    "threads",
    "context",
    "windows_per_epoch",
    "blocks_per_stage",
)  # or None, where the key may be empty
_NON_NEGATIVE = (
    "base_lr",
    "momentum",
    "weight_decay",
    "warmup_epochs",
    "gamma",
    "fidelity_every",
    "bn_reestimate_batches",
    "rebuild_span",
    "weight_prediction",
)


TEXT_CONTEXTS = {"cpu": 64, "gpu": 256}  # the character-level GPT sizes' contexts (families/transformers.py LM_SIZES)


class ConfigError(ValueError):
    """A bad configuration: the message names the key and what is allowed."""


def _registry(name: str) -> dict:
    """The registries whose live names a key allows, imported on first use: they import torch, and
    a typo in a config must be answered before that (``petra train bad_key=1`` in a blink)."""
    from ..data.sources import DATASETS, SOURCES
    from ..engine.phases import PHASES
    from ..families.registry import FAMILIES
    from ..methods import METHODS
    from ..models.aux_heads import AUX_HEADS
    from ..models.specs import ARCHS
    from ..optim import OPTIMIZERS
    from ..precision import PRECISIONS
    from ..replicas import REPLICA_RULES

    return {
        "ARCHS": ARCHS,
        "MODEL_ARCHS": {arch: family for family in FAMILIES.values() for arch in family.archs},
        "AUX_HEADS": AUX_HEADS,
        "DATASETS": DATASETS,
        "METHODS": METHODS,
        "OPTIMIZERS": OPTIMIZERS,
        "PHASES": PHASES,
        "PRECISIONS": PRECISIONS,
        "REPLICA_RULES": REPLICA_RULES,
        "SOURCES": SOURCES,
    }[name]


def _names(name: str, *extra):
    """``choices`` of a key: registry ``name``'s names (after ``extra``), read when first checked."""
    return lambda: (*extra, *_registry(name))


def _rule_stages_help() -> str:
    rules = _registry("REPLICA_RULES")
    return (
        "/".join(name for name, rule in rules.items() if rule.staged)
        + ": the contiguous stage groups L the cyclic delay counts (default: one per stage of the model)"
    )


def _rule_options_help() -> str:
    from ..replicas.options import option_names

    return "the replica rule's own settings (the fields of its Options): " + "; ".join(
        f"{name} {{{', '.join(option_names(rule.Options))}}}"
        for name, rule in _registry("REPLICA_RULES").items()
        if option_names(rule.Options)
    )


def _resolved(value):
    """A key's ``choices`` or ``help``, computed now if it is read from a registry."""
    return value() if callable(value) else value


def _key(default, help, choices: Collection | Callable | None = None, example: str | None = None):
    """A config key; ``choices``: the values allowed (a registry's live keys, :func:`_names`, so a
    rule or dataset registered later is allowed too); ``help`` may be computed from a registry."""
    kw = (
        {"default_factory": lambda: type(default)(default)}
        if isinstance(default, (list, dict))
        else {"default": default}
    )
    return field(**kw, metadata={"help": help, "choices": choices, "example": example})


@dataclass
class RunConfig:
    # what is trained
    arch: str = _key("revnet18", "model (any registered model family's)", _names("MODEL_ARCHS"))
    width: int | None = _key(
        None,
        "base channel width of a ResNet/RevNet (unset: 64 = the paper's models); a transformer's embedding "
        "width (unset: its arch's or size's)",
    )
    size: str | None = _key(
        None,
        "text datasets: the character-level GPT's shape, nanoGPT's: cpu (4 layers, 4 heads, 128-dim, context "
        "64) or gpu (6, 6, 384, 256); unset: cpu",
        (None, *TEXT_CONTEXTS),
    )
    context: int | None = _key(
        None, "text datasets: characters per window, the model's context T (unset: the size's, 64 or 256)"
    )
    windows_per_epoch: int | None = _key(
        None,
        "text datasets: training windows per epoch, drawn at random (unset: (training characters - 1) // "
        "context, about one pass over the training split); an epoch ends with an evaluation and a checkpoint",
    )
    method: str = _key("petra", "training method", _names("METHODS"))
    aux_head: str | None = _key(
        None,
        "auxiliary head on every stage but the head, for local learning (local, fg-local-w, fg-local-a): cnn or linear",
        _names("AUX_HEADS", None),
    )
    k: int = _key(1, "gradient accumulation: minibatches per optimizer step")
    rebuild_span: int = _key(
        0,
        "petra, revbackprop: at most this many consecutive reversible stages rebuild their inputs "
        "from one exact value; the stage before such a run keeps its input instead (0 = no bound, "
        "the paper's PETRA; docs/architecture.md, Bounded rebuild chains)",
    )
    weight_prediction: float = _key(
        0.0,
        "delayed, dsp, petra: each stage forwards at w + weight_prediction x tau x dw, tau its delay in "
        "optimizer steps, dw its last update (PipeMare's linear prediction: 1; 0 = off, the paper's; "
        "docs/architecture.md, Weight prediction)",
    )
    blocks_per_stage: int = _key(
        1,
        "transformers: consecutive blocks in one stage (a divisor of the depth): fewer stages, so "
        "shorter delays and less parallelism (1: a stage per block)",
    )
    seed: int = _key(0, "seed of weight initialisation, data order and augmentation")
    # data
    dataset: str = _key("synthetic", "dataset", _names("DATASETS"))
    data_source: str | None = _key(
        None, "raw source to prepare from (tar.gz / image folder / pickle dir / ImageFolder root)"
    )
    data_dir: str = _key("data/prepared", "where prepared datasets are kept (one sub-directory per dataset)")
    subset: int | None = _key(None, "train on the first N examples of a fixed permutation of the training set")
    synthetic_train: int = _key(2048, "synthetic dataset: training examples")
    synthetic_test: int = _key(512, "synthetic dataset: test examples")
    synthetic_classes: int = _key(10, "synthetic dataset: classes")
    # recipe
    epochs: int = _key(2, "training epochs (the pipeline is drained once, at the end)")
    batch_size: int = _key(64, "minibatch size")
    eval_batch_size: int = _key(256, "evaluation batch size")
    base_lr: float = _key(0.1, "base learning rate, before Goyal scaling")
    scale_lr: bool = _key(True, "lr = base_lr * batch_size * k / 256 (Goyal et al.)")
    optimizer: str = _key(
        "sgd", "sgd (Nesterov momentum) or adamw (ACCO's optimizer: adam_betas, adam_eps)", _names("OPTIMIZERS")
    )
    momentum: float = _key(0.9, "Nesterov momentum (sgd)")
    adam_betas: list = _key(
        [0.9, 0.999], "adamw: (beta1, beta2), each in [0, 1) (ACCO's official configuration: [0.9, 0.95])"
    )
    adam_eps: float = _key(1e-8, "adamw: epsilon")
    weight_decay: float = _key(5e-4, "weight decay (on batch-norm parameters and biases only with decay_1d)")
    decay_1d: bool = _key(
        False,
        "also decay parameters of one dimension or fewer (biases, batch norm), as the official CDP, PAPA "
        "and ACCO codes do (docs/conventions.md)",
    )
    warmup_epochs: float = _key(0.0, "linear warm-up length in epochs (its clock: warmup_clock)")
    warmup_clock: str = _key(
        "step",
        "what the warm-up counts: step (each stage's optimizer steps, lr*(s+1)/W) or call (the authors' "
        "simulator: one ramp for all stages over the minibatches entering the pipeline, lr*(c+1)/W; "
        "docs/conventions.md)",
        ("step", "call"),
    )
    milestones: list = _key([], "epochs at which the learning rate is multiplied by gamma", example="[150, 225]")
    gamma: float = _key(0.1, "learning-rate decay factor at milestones")
    lr_decay: str = _key(
        "step",
        "after the warm-up: step (x gamma at the milestones) or cosine (every step, down to "
        "final_lr_ratio x the peak at the last epoch; nanoGPT's and minREV's recipes; no milestones)",
        ("step", "cosine"),
    )
    final_lr_ratio: float = _key(0.0, "lr_decay=cosine: the last epoch's lr over the peak, in [0, 1] (nanoGPT: 0.1)")
    # evaluation
    eval_every: int = _key(1, "evaluate on the test set every N epochs (and always after the last)")
    bn_reestimate_batches: int = _key(
        50,
        "after training, also report top-1 with batch-norm statistics re-estimated on this many fixed "
        "training batches (a diagnostic; 0 = off)",
    )
    evaluated_model: str = _key(
        "replica0",
        "replicas > 1: the model whose top-1 is the run's: replica0, average (the replicas' weight average, "
        "as the official CDP code evaluates) or both (replica 0's, and the average's as average_*)",
        ("replica0", "average", "both"),
    )
    # execution
    device: str = _key(
        "cpu",
        "cpu or cuda; with more than one visible GPU, petra train starts one rank per GPU (--launch ranks, "
        "docs/distributed.md); in one process (--launch process) the stages spread over the visible GPUs",
        ("cpu", "cuda"),
    )
    threads: int | None = _key(None, "torch CPU threads (default: torch's choice)")
    prefetch: int | None = _key(
        None,
        "minibatches made ahead by a background thread (pinned on cuda); default: 4 "
        "on cuda, 0 on cpu (where the cores are busy training)",
    )
    channels_last: bool = _key(
        True,
        "weights and activations in channels-last memory format: oneDNN's convolutions "
        "ran 7-33 % faster on CPU at widths 8 and 64 (benchmarks/bench_speed.py); "
        "false: contiguous NCHW",
    )
    precision: str = _key(
        "fp32",
        "numeric precision of the stages' compute: fp32 (strict, TF32 off), tf32 (TF32 matmuls "
        "and convolutions on CUDA) or bf16 (autocast; weights, gradients and the activations "
        "stages send stay float32); unset: bf16 with device=cuda, fp32 otherwise",
        _names("PRECISIONS"),
    )
    phases: str = _key(
        "eager",
        "how each stage's phases execute: eager, static (on fixed buffers, the shape a CUDA graph "
        "replays; the same bits) or graphs (static, captured as CUDA graphs and replayed: little host "
        "work per tick; cuda only); static and graphs run petra, dsp and revbackprop with one replica "
        "(docs/gpu.md)",
        _names("PHASES"),
    )
    stage_streams: bool = _key(
        False,
        "a CUDA stream per stage in one process, joined at each tick's end, so the stages' kernels "
        "of a tick can overlap on one GPU or several (the same bits); device=cuda, one replica, "
        "runtime=simulator only (docs/gpu.md)",
    )
    deterministic: bool = _key(
        True,
        "deterministic algorithms and cuDNN without benchmarking (bit-exact repeatability "
        "on one machine); false: cuDNN picks its fastest algorithms",
    )
    runtime: str = _key(
        "simulator",
        "simulator (one process) or distributed (one process per rank, under torchrun)",
        ("simulator", "distributed"),
    )
    replicas: int = _key(
        1,
        "data-parallel replicas of the pipeline (the mesh's replica axis): each trains on its own "
        "shard of every epoch; distributed: a divisor of the number of ranks",
    )
    replica_rule: str = _key("dp", "what the replicas do together around each optimizer step", _names("REPLICA_RULES"))
    rule_stages: int | None = _key(None, _rule_stages_help)
    rule_options: dict = _key({}, _rule_options_help, example="{p: 0.005}")
    placement: str = _key("even", "distributed: stages per rank: even, balanced (measured) or ranges like 0-3,4-9")
    dist_timeout: float = _key(60.0, "distributed: seconds before a silent peer is declared failed")
    fidelity_every: int = _key(0, "every N optimizer steps, compare delayed gradients with true ones (0 = off)")
    progress: bool = _key(True, "show a tqdm progress bar")
    logger: str = _key(
        "none",
        "also write each epoch's record, beside history.json: none, csv (history.csv in the run "
        "directory) or tensorboard (event files under tensorboard/; needs the tensorboard package)",
        ("none", "csv", "tensorboard"),
    )

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict) -> RunConfig:
        if not isinstance(values, dict):
            raise ConfigError(f"a config must be a mapping of keys to values, got {type(values).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            close = difflib.get_close_matches(unknown[0], known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"unknown config key {unknown[0]!r}{hint}; allowed: {', '.join(known)}")
        if "precision" not in values:  # bf16 on a GPU, where fp32 leaves it waiting for the host
            values = {**values, "precision": "bf16" if values.get("device") == "cuda" else "fp32"}
        hints = typing.get_type_hints(cls)
        cfg = cls(
            **{
                name: _coerce(name, value, hints[name], known[name].metadata.get("example"))
                for name, value in values.items()
            }
        )
        cfg._check_choices()
        cfg._fill_model_defaults()
        cfg.validate()
        return cfg

    def _fill_model_defaults(self) -> None:
        """What an unset model key means, written into the config (and so into the run's record): a
        ResNet/RevNet's width 64 (as before width could be unset); on a text dataset, the size cpu and
        its context."""
        if self.width is None and self.arch in _registry("ARCHS"):
            self.width = 64
        if self.data_kind() == "text":
            self.size = "cpu" if self.size is None else self.size
            if self.context is None and self.size in TEXT_CONTEXTS:  # a bad size is refused by validate
                self.context = TEXT_CONTEXTS[self.size]

    def data_kind(self) -> str:
        """``images`` or ``text``: what the dataset holds (its source's kind)."""
        return _registry("SOURCES")[self.dataset].kind

    @classmethod
    def load(cls, *paths: str | Path, overrides: list[str] = ()) -> RunConfig:
        """Merge YAML files left to right, then ``key=value`` overrides (values parsed as YAML)."""
        values: dict = {}
        for path in paths:
            try:
                loaded = yaml.safe_load(Path(path).read_text()) or {}
            except FileNotFoundError:
                raise ConfigError(f"config file {str(path)!r} does not exist") from None
            except yaml.YAMLError as err:
                raise ConfigError(f"config file {yaml_error(path, err)}") from None
            if not isinstance(loaded, dict):
                raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys to values")
            values.update(loaded)
        for item in overrides:
            key, sep, raw = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"override {item!r} is not of the form key=value")
            values[key.strip()] = yaml.safe_load(raw) if raw.strip() else None
        return cls.from_dict(values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Refuse a meaningless configuration with one line, topic by topic."""
        self._check_choices()
        self._check_numbers()
        self._check_execution()
        self._check_replica_rule()
        self._check_method()
        self._check_data()
        self._check_model()

    def _check_choices(self) -> None:
        for f in dataclasses.fields(self):
            choices = _resolved(f.metadata.get("choices"))
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise ConfigError(f"{f.name}={value!r} is not allowed; allowed: {', '.join(map(str, choices))}")

    def _check_numbers(self) -> None:
        if self.prefetch is not None and self.prefetch < 0:
            raise ConfigError(f"prefetch={self.prefetch!r} must be >= 0")
        for name in _POSITIVE:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name}={value!r} must be >= 1")
        if self.synthetic_classes < 2:
            raise ConfigError(f"synthetic_classes={self.synthetic_classes!r} must be >= 2")
        for name in _NON_NEGATIVE:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        if len(self.adam_betas) != 2 or any(
            not isinstance(b, (int, float)) or isinstance(b, bool) or not 0 <= b < 1 for b in self.adam_betas
        ):
            raise ConfigError(
                f"adam_betas={self.adam_betas!r} must be two numbers in [0, 1), e.g. adam_betas=[0.9, 0.95]"
            )
        if self.adam_eps <= 0:
            raise ConfigError(f"adam_eps={self.adam_eps!r} must be > 0")
        if any(not isinstance(m, (int, float)) or isinstance(m, bool) or m <= 0 for m in self.milestones):
            raise ConfigError(
                f"milestones={self.milestones!r} must be a list of positive epoch numbers, e.g. milestones=[150, 225]"
            )
        self._check_schedule()

    def _check_schedule(self) -> None:
        """The learning-rate schedule's keys, together (the cosine takes no milestones)."""
        if not 0 <= self.final_lr_ratio <= 1:
            raise ConfigError(f"final_lr_ratio={self.final_lr_ratio!r} must be in [0, 1], e.g. final_lr_ratio=0.1")
        if self.lr_decay == "cosine":
            if self.milestones:
                raise ConfigError(
                    f"milestones={self.milestones!r} with lr_decay=cosine; use milestones=[] (the cosine decays "
                    f"every step) or lr_decay=step"
                )
            if self.warmup_clock != "step":
                raise ConfigError("lr_decay=cosine needs warmup_clock=step (the call clock ramps in minibatches)")
            if self.warmup_epochs >= self.epochs:
                raise ConfigError(
                    f"warmup_epochs={self.warmup_epochs!r} leaves no epoch for lr_decay=cosine "
                    f"(epochs={self.epochs!r}); use warmup_epochs < epochs"
                )

    def _check_execution(self) -> None:
        from .loggers import tensorboard_missing

        if missing := tensorboard_missing(self.logger):
            raise ConfigError(missing)
        if self.dist_timeout <= 0:
            raise ConfigError(f"dist_timeout={self.dist_timeout!r} must be > 0 (seconds)")
        if self.placement not in ("even", "balanced") and not _RANGES.fullmatch(self.placement.replace(" ", "")):
            raise ConfigError(
                f"placement={self.placement!r} is not allowed; allowed: even, balanced, or inclusive "
                f"stage ranges in rank order like 0-3,4-9"
            )
        if self.runtime == "distributed" and self.fidelity_every:
            raise ConfigError(
                f"fidelity_every={self.fidelity_every!r} needs runtime=simulator (the true gradient "
                f"needs the whole model in one process); use fidelity_every=0"
            )

    def _check_replica_rule(self) -> None:
        """What the rule declares (``ReplicaRule``): its stage groups, options, replicas and schedules."""
        from ..methods import METHODS
        from ..replicas import REPLICA_RULES, get_rule

        declared = REPLICA_RULES[self.replica_rule]
        if self.rule_stages is not None:
            if not declared.staged:
                staged = [name for name, rule in REPLICA_RULES.items() if rule.staged]
                raise ConfigError(
                    f"rule_stages={self.rule_stages!r} is only used by replica_rule {' or '.join(staged)}; "
                    f"replica_rule={self.replica_rule!r} would ignore it (use rule_stages=null)"
                )
            if self.rule_stages < 1:
                raise ConfigError(f"rule_stages={self.rule_stages!r} must be >= 1")
        if self.evaluated_model != "replica0" and self.replicas < 2:
            raise ConfigError(
                f"evaluated_model={self.evaluated_model!r} needs replicas >= 2 (one model is its own "
                f"average); use evaluated_model=replica0"
            )
        if declared.needs_replicas and self.replicas < 2:
            raise ConfigError(
                f"replica_rule={self.replica_rule!r} is meaningless with replicas={self.replicas} (it is what "
                f"replicas do to each other); use replicas >= 2, or replica_rule=dp for a single model"
            )
        try:
            rule = get_rule(self.replica_rule, stages=self.rule_stages, options=self.rule_options, seed=self.seed)
        except ValueError as err:
            raise ConfigError(f"rule_options={self.rule_options!r}: {err}") from None
        try:
            rule.check(schedule=METHODS[self.method].schedule, k=self.k)
        except ValueError as err:
            raise ConfigError(
                f"replica_rule={self.replica_rule!r} with method={self.method!r}, k={self.k}: {err}"
            ) from None

    def _check_method(self) -> None:
        from ..methods import METHODS
        from ..models.aux_heads import AUX_HEADS
        from ..models.specs import ARCHS

        method = METHODS[self.method]
        try:
            method.bounded(self.rebuild_span).predicting(self.weight_prediction)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if method.needs_aux and self.aux_head is None:
            raise ConfigError(
                f"method={self.method!r} trains stages from auxiliary heads; set aux_head (allowed: "
                f"{', '.join(AUX_HEADS)})"
            )
        if self.aux_head is not None and not method.needs_aux:
            raise ConfigError(
                f"aux_head={self.aux_head!r} is only used by local learning; method={self.method!r} "
                f"would leave the heads untrained (use aux_head=null, or method local, fg-local-w, "
                f"fg-local-a)"
            )
        if method.needs_reversible and self.arch in ARCHS and not ARCHS[self.arch].reversible:
            raise ConfigError(
                f"method={self.method!r} needs a reversible model, arch={self.arch!r} has none; "
                f"use a revnet, or method dsp"
            )

    def _check_data(self) -> None:
        source = _registry("SOURCES")[self.dataset]
        if not (source.generated or source.fetches) and self.data_source is None and not self.prepared_path().exists():
            raise ConfigError(
                f"dataset={self.dataset!r} needs data_source (raw data) or a prepared copy in {self.prepared_path()}"
            )
        kind, reads = source.kind, _registry("MODEL_ARCHS")[self.arch].data_kind
        if kind != reads:
            readers = [a for a, family in _registry("MODEL_ARCHS").items() if family.data_kind == kind]
            raise ConfigError(
                f"arch={self.arch!r} reads {reads}, dataset={self.dataset!r} holds {kind}; allowed archs: "
                f"{', '.join(readers) or 'none registered'}"
            )
        if kind != "text":
            for key in ("size", "context", "windows_per_epoch"):
                if getattr(self, key) is not None:
                    raise ConfigError(
                        f"{key}={getattr(self, key)!r} is only used by text datasets "
                        f"({', '.join(n for n, s in _registry('SOURCES').items() if s.kind == 'text')}); "
                        f"dataset={self.dataset!r} holds images (use {key}=null)"
                    )
        elif self.subset is not None:
            raise ConfigError(f"subset={self.subset!r} subsets an image dataset; dataset={self.dataset!r} is text")

    def _check_model(self) -> None:
        if self.blocks_per_stage == 1:
            return
        cuttable = [a for a, family in _registry("MODEL_ARCHS").items() if family.cuts_blocks_per_stage]
        if self.arch not in cuttable:
            raise ConfigError(
                f"blocks_per_stage={self.blocks_per_stage!r} groups a transformer's blocks into stages; "
                f"arch={self.arch!r} has a stage per block (allowed archs: {', '.join(cuttable)}; "
                f"or blocks_per_stage=1)"
            )

    def prepared_path(self) -> Path:
        return Path(self.data_dir) / self.dataset

    @classmethod
    def describe(cls) -> str:
        """Every key with its type, default and description (for --help-config and the docs)."""
        hints = typing.get_type_hints(cls)
        lines = []
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            choices = _resolved(f.metadata.get("choices"))
            extra = f" (one of: {', '.join(map(str, choices))})" if choices else ""
            help = _resolved(f.metadata["help"])
            lines.append(f"{f.name:<18} {_type_name(hints[f.name]):<12} {default!r:<18} {help}{extra}")
        return "\n".join(lines)


def yaml_error(path: str | Path, err: yaml.YAMLError) -> str:
    """``'PATH' line L, column C is not valid YAML: what the parser found``: where to look first."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    return f"{str(path)!r}{where} is not valid YAML: {f'{context}, ' if context else ''}{what}"


def _type_name(tp) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if args:
        return f"{args[0].__name__}?"
    return getattr(tp, "__name__", str(tp))


def _coerce(name: str, value, tp, example: str | None = None):
    """Check ``value`` against the field type; ints are accepted where floats are expected."""
    args = typing.get_args(tp)
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), tp)
    if base is float and isinstance(value, str):  # YAML 1.1 reads 5e-4 (no dot) as a string
        with contextlib.suppress(ValueError):
            value = float(value)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{name} must not be empty; expected {_type_name(tp)}")
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        list: isinstance(value, list),
        dict: isinstance(value, dict),
    }.get(base, True)
    if not ok:
        hint = f", e.g. {name}={example}" if example else ""
        raise ConfigError(f"{name}={value!r} has the wrong type; expected {_type_name(tp)}{hint}")
    return float(value) if base is float else value


WATCH_KEYS = (
    "progress",
    "threads",
    "prefetch",
    "stage_streams",
    "logger",
)  # how a run is run and watched, not what it computes


def check_same_run(where: object, saved: dict | None, cfg: RunConfig) -> None:
    """Refuse to continue a run directory or checkpoint that holds another configuration."""
    if saved is None:
        return
    saved = RunConfig.from_dict(saved).to_dict()
    for key, value in cfg.to_dict().items():
        if key not in WATCH_KEYS and saved.get(key) != value:
            raise ConfigError(
                f"{where} holds a run with {key}={saved.get(key)!r}, not {value!r}; use another run directory"
            )
