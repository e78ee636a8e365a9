"""PETRA's reconstruction error per stage under fp32, TF32 and bf16 (petra_core.accounting.reconstruction).

    python benchmarks/bench_precision.py                  # CPU: fp32 and bf16 (TF32 is fp32 on a CPU)
    python benchmarks/bench_precision.py --device cuda    # fp32, tf32 and bf16 on the GPU

RevNet18 and RevNet50 at the paper's width (64), CIFAR stem, batch 32 of random images, seeded
initial weights, batch statistics (as the reconstruction runs in training); the reversible
transformers at their default shapes: ``revvit`` (minREV's: embed 128, depth 6, 8 heads, patch 4)
on random 32x32 images and ``revgpt`` (nanoGPT's CPU size: 4 layers, 128-dim, context 64) on random
windows of 65 characters. For every reversible
stage: the relative error of the rebuilt input ‖x̂ − x‖ / ‖x‖, and its position in the chain of
rebuilds (1: rebuilt from an exact output; 2: from an input the next stage rebuilt, ...).
Each precision with float32 messages between stages (what training does); bf16 also with
16-bit messages (``native``), the contrast. Writes ``results/precision/<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from petra_core.accounting.reconstruction import reconstruction_errors  # noqa: E402
from petra_core.families.registry import build as build_model  # noqa: E402  (any family's arch)

VOCAB = 65  # the character-level model's vocabulary here (Shakespeare's is 84, Botchan's 78: any will do)


def model_and_input(arch: str, args, device):
    """The seeded model and a random input of its kind: images, or a window of character ids."""
    torch.manual_seed(0)
    if arch in ("revgpt", "gpt"):
        model = build_model(arch, num_classes=VOCAB)
        return model.to(device), torch.randint(0, VOCAB, (args.batch, 64), device=device)
    options = {} if arch in ("revvit", "vit") else {"width": args.width}
    return build_model(arch, num_classes=10, **options).to(device), torch.randn(args.batch, 3, 32, 32, device=device)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--archs", default="revnet18,revnet50,revvit,revgpt")
    p.add_argument("--width", type=int, default=64, help="the RevNets' width (the transformers keep their own)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="results/precision")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    # (precision, messages): as training runs them (float32 messages), and bf16 with 16-bit messages
    # as the contrast that shows why training widens what stages send
    settings = [("fp32", "float32"), ("tf32", "float32"), ("bf16", "float32"), ("bf16", "native")]
    if device.type != "cuda":
        settings.remove(("tf32", "float32"))  # TF32 is fp32 on a CPU
    rows = []
    for arch in args.archs.split(","):
        model, x = model_and_input(arch, args, device)
        for name, messages in settings:
            for r in reconstruction_errors(model, x, name, messages):
                if r["rebuilds"]:
                    rows.append({"arch": arch, **r})
        print(f"{arch}: relative error of each rebuilt input (stage: chain position)")
        for name, messages in settings:
            cells = [
                f"{r['stage']}:{r['chain']} {r['rel_error']:.1e}"
                for r in rows
                if r["arch"] == arch and r["precision"] == name and r["messages"] == messages
            ]
            print(f"  {name:5s} {messages:8s}" + "  ".join(cells))
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or platform.machine()
    out = {
        "device": name,
        "torch": torch.__version__,
        "width": args.width,
        "batch": args.batch,
        "rows": rows,
    }  # width: RevNets
    path = Path(args.out) / f"{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-').lower() or 'device'}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    main()
