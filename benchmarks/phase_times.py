"""Time of each stage's phases (forward, rebuild, backward, send, step) per minibatch, on the host
and on the device: what a cluster model of the pipeline starts from (issue 41). The clock lives in
the package, ``petra_core/plan/clock.py`` (``petra plan profile`` uses it); this module keeps its
names for the GPU benchmark (``bench_gpu.py``) and its tests.
"""

from petra_core.plan.clock import (  # noqa: F401  (re-exported)
    AHEAD_FACTOR,
    AHEAD_S,
    PhaseClock,
    cuda_mark,
    cuda_sleep,
    per_stage_ms,
    sleep_cycles_per_s,
    stage_phase_times,
)
