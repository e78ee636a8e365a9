"""Display names and number formats shared by the tables and the figures."""

from __future__ import annotations

import math
import re

import pandas as pd

METHOD_LABELS = {
    "backprop": "Backprop",
    "revbackprop": "Rev. backprop",
    "delayed": "Delayed (weight stash)",
    "dsp": "DSP (input buffers)",
    "petra": "PETRA",
    "local": "Local (aux. heads)",
    "fg-local-w": "Forward grad., local guess (W)",
    "fg-local-a": "Forward grad., local guess (A)",
}
METHOD_ORDER = ["backprop", "revbackprop", "delayed", "dsp", "petra", "local", "fg-local-w", "fg-local-a"]
LOCAL_LEARNING = ("local", "fg-local-w", "fg-local-a")  # not in the paper: a row block of their own
DATASET_LABELS = {
    "cifar10": "CIFAR-10",
    "imagenet32": "ImageNet32",
    "imagenet": "ImageNet",
    "synthetic": "synthetic",
    "shakespeare": "Shakespeare",
    "botchan": "Botchan",
}


NAMED_MODELS = {"revgpt": "RevGPT", "gpt": "GPT", "revvit": "RevViT", "vit": "ViT"}


def model_label(arch: str) -> str:
    """``revnet18`` -> ``RevNet18``, ``revgpt`` -> ``RevGPT``."""
    if arch in NAMED_MODELS:
        return NAMED_MODELS[arch]
    family, depth = re.fullmatch(r"([a-z]+?)(\d+)", arch).groups()
    return {"resnet": "ResNet", "revnet": "RevNet"}.get(family, family) + depth


def run_label(method: str, k: int) -> str:
    return f"{METHOD_LABELS.get(method, method)} k={k}"


def missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def num(x, digits: int = 1) -> str:
    """A number with ``digits`` decimals; '–' for a missing value."""
    return "–" if missing(x) else f"{float(x):.{digits}f}"


def pm(mean, std, n, digits: int = 1, tex: bool = False) -> str:
    """``mean ± std (n = N)``; the std is left out when n = 1 (a single run has none)."""
    if missing(mean):
        return "–"
    sign, eq = (r"$\pm$", "$n = {}$") if tex else ("±", "n = {}")
    spread = f" {sign} {float(std):.{digits}f}" if not missing(std) and int(n) > 1 else ""
    return f"{float(mean):.{digits}f}{spread} ({eq.format(int(n))})"


def signed(x, err=None, tex: bool = False, digits: int = 2) -> str:
    """A gap: ``-1.23 ± 0.40`` (the ± only when known); '–' for a missing value."""
    if missing(x):
        return "–"
    sign = r"$\pm$" if tex else "±"
    spread = f" {sign} {float(err):.{digits}f}" if not missing(err) else ""
    return f"{float(x):+.{digits}f}{spread}"


def millions(count) -> str:
    return "–" if missing(count) else f"{float(count) / 1e6:.3g}M"


def pretty_expr(expr) -> str:
    """``2*(J-j)/k`` -> ``2(J−j)/k``; ``3*J`` -> ``3J``."""
    s = str(expr).replace(" ", "")
    s = re.sub(r"(\d)\*(?=[A-Za-z(])", r"\1", s)
    return s.replace(")*", ")·").replace("*", "·").replace("-", "−")


def formula(expr, value, digits: int = 2) -> str:
    """A paper cell of Table 1: ``2(J−j) = 14.00``, or just the number for a constant entry ('–':
    a method the paper does not have)."""
    if missing(value) or str(expr) == "":
        return "–"
    try:
        float(str(expr))
    except ValueError:
        return f"{pretty_expr(expr)} = {num(value, digits)}"
    return str(expr)


_TEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "−": "$-$",
    "·": r"$\cdot$",
    "×": r"$\times$",
    "–": "--",
    "∥": r"$\parallel$",
    "≥": r"$\geq$",
    "⌈": r"$\lceil$",
    "⌉": r"$\rceil$",
}


def tex(text) -> str:
    """Escape plain text for LaTeX (and map the few symbols the tables use)."""
    return "".join(_TEX.get(c, c) for c in str(text))


def setting(frame: pd.DataFrame, key: str) -> pd.Series:
    """A run setting's column: the identity's where the profile varies ``key`` between its rows
    (``batch_size`` of the transformers profile), else the run config's (``cfg_<key>``); all NaN
    where neither is there."""
    for column in (key, f"cfg_{key}"):
        if column in frame.columns:
            return frame[column]
    return pd.Series(float("nan"), index=frame.index, dtype=object)


def describe_runs(results: pd.DataFrame) -> str:
    """One line naming what the runs of a profile were: data, width, epochs, batch, hardware."""
    parts = []
    for dataset, g in results.groupby("dataset", sort=False):
        subsets = sorted(int(x) for x in setting(g, "subset").dropna().unique())
        subset = f", {'/'.join(map(str, subsets))}-example training subset" if subsets else ""
        batches = "/".join(str(int(b)) for b in sorted(setting(g, "batch_size").dropna().unique()))
        replicas = sorted(int(x) for x in g.cfg_replicas.dropna().unique()) if "cfg_replicas" in g else []
        if replicas and replicas != [1]:
            batches = f"{batches} per replica, {'/'.join(map(str, replicas))} replicas"
        widths = sorted(int(w) for w in g.width.dropna().unique())
        width = f", width {'/'.join(map(str, widths))}" if widths else ""
        sizes = sorted(str(x) for x in setting(g, "size").dropna().unique())
        size = f", size {'/'.join(sizes)}" if sizes and not widths else ""
        parts.append(
            f"{DATASET_LABELS.get(dataset, dataset)}{subset}{width}{size}, "
            f"{'/'.join(map(str, sorted(g.epochs_done.unique())))} epochs, batch {batches}"
        )
    env = results.iloc[0]
    hardware = f"{env.get('env_device', '?')}"
    if env.get("env_device") == "cpu":
        hardware += f" ({env.get('env_processor', '?')}, {env.get('env_torch_threads', '?')} thread(s))"
    elif not missing(env.get("env_gpus")):
        hardware += f" ({env.get('env_gpus')})"
    revisions = sorted(
        {
            str(r)[:12] + ("-dirty" if str(r).endswith("-dirty") else "")
            for r in results.get("env_git_revision", pd.Series(dtype=object)).dropna()
        }
    )
    code = f", code at revision {', '.join(revisions)}" if revisions else ""
    return f"{'; '.join(parts)}; trained on {hardware}, torch {env.get('env_torch', '?')}{code}"
