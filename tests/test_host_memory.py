"""host_memory: glibc keeps freed buffers (fewer page faults), the bits of a run do not change, and
a bad setting is one clear line."""

import subprocess
import sys

import pytest

from petra_core.engine import host_memory

RUN = """
import sys
import torch
from petra_core import Recipe, build_model, simulate
from petra_core.engine import host_memory
print(host_memory.retain_freed_memory())  # as a run does, before its pipeline (the engine never calls it)
torch.manual_seed(0)
model = build_model("revnet18", num_classes=10, width=4)
g = torch.Generator().manual_seed(1)
batches = [(torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(6)]
simulate(model, "petra", batches, recipe=Recipe(base_lr=0.05))
torch.save(model.state_dict(), sys.argv[1])
"""


def run(tmp_path, setting: str) -> tuple[dict, str]:
    out = tmp_path / f"{setting}.pt"
    env = {"PETRA_HOST_MALLOC": setting, "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", RUN, str(out)], env=env, capture_output=True, text=True, check=True)
    import torch

    return torch.load(out), proc.stdout.strip()


def test_retaining_freed_memory_leaves_the_bits_alone(tmp_path):
    import torch

    retained, applied = run(tmp_path, "retain")
    system, untouched = run(tmp_path, "system")
    assert untouched == "False"
    if sys.platform.startswith("linux"):
        assert applied == "True"
    assert retained.keys() == system.keys()
    assert all(torch.equal(retained[k], system[k]) for k in retained)


def test_a_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("PETRA_HOST_MALLOC", "jemalloc")
    with pytest.raises(ValueError, match="PETRA_HOST_MALLOC='jemalloc': allowed values are retain, system"):
        host_memory.setting()
