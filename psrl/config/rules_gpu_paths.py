"""Settings that act only on a GPU path: an explicit ``true`` is refused where nothing would read it (``auto``
leaves each off there). The trainer's warm-up builds compiled graphs, a landed version is loaded by the
embedded engine on a GPU, and graphs captured at the start are the embedded engine's CUDA decode rounds.
"""

from __future__ import annotations

from collections.abc import Iterator

from psrl.config.root import Config
from psrl.errors import ConfigProblem

PS = "psrl.ps."


def _problem(paths: tuple[str, ...], message: str, fix: str) -> ConfigProblem:
    return ConfigProblem(paths, repr(True), message, fix)


def warm_up_applies(c: Config) -> Iterator[ConfigProblem]:
    """actor.warm_up=true builds the compiled layers on one trainer rank with its memory resident."""
    if c.actor.warm_up is not True:
        return
    fix = "set actor.warm_up=auto"
    compiles = c.actor.compile is True or (c.actor.compile == "auto" and c.topology.device != "cpu")
    if not compiles:
        yield _problem(("actor.warm_up", "actor.compile"), "the warm-up builds the compiled layers, and none are "
                       "compiled here", f"{fix}, or actor.compile=true")  # fmt: skip
    if c.topology.n_trainer_ranks > 1:
        yield _problem(("actor.warm_up", "topology.n_trainer_ranks"), "ranks would warm up on threads of their own "
                       "while their collectives wait for each other", fix)  # fmt: skip
    if c.topology.colocate:
        yield _problem(("actor.warm_up", "topology.colocate"), "colocated, the rollout holds the GPUs while the "
                       "first batch is made", fix)  # fmt: skip


def prefetch_to_device_applies(c: Config) -> Iterator[ConfigProblem]:
    """psrl.ps.prefetch_to_device=true: a prefetched version, loaded by the embedded engine on its own GPU."""
    ps = c.psrl.ps
    if ps.prefetch_to_device is not True:
        return
    fix = f"set {PS}prefetch_to_device=auto"
    blockers = (
        (not ps.prefetch, PS + "prefetch", "only a prefetched version lands: there is no background pull"),
        (ps.delta_sync, PS + "delta_sync", "delta sync pulls at sync time, so nothing is prefetched"),
        (c.topology.device == "cpu", "topology.device", "a version lands on a GPU"),
        (c.engine.backend != "embedded", "engine.backend", "the embedded engine loads a landed version"),
        (c.topology.colocate, "topology.colocate", "a colocated instance gives its GPU memory to the trainer "
         "while versions arrive"),
    )  # fmt: skip
    for blocked, field, message in blockers:
        if blocked:
            yield _problem((PS + "prefetch_to_device", field), message, fix)


def graph_capture_applies(c: Config) -> Iterator[ConfigProblem]:
    """engine.capture_graphs_at_start / capture_graphs_when_idle = true: the embedded engine's decode rounds,
    replayed as CUDA graphs."""
    engine = c.engine
    blockers = (
        (c.topology.device == "cpu", "topology.device", "CUDA graphs are captured on a GPU"),
        (engine.backend != "embedded", "engine.backend", "vLLM captures its own graphs"),
        (not engine.cuda_graphs, "engine.cuda_graphs", "the decode rounds run without graphs"),
        (engine.gpu_kernels == "off", "engine.gpu_kernels", "decode rounds run on the GPU step kernels"),
    )
    for knob, fix in (("capture_graphs_at_start", "false"), ("capture_graphs_when_idle", "auto")):
        if getattr(engine, knob) is not True:
            continue
        for blocked, field, message in blockers:
            if blocked:
                yield _problem((f"engine.{knob}", field), message, f"set engine.{knob}={fix}")
    if engine.capture_graphs_when_idle is True and engine.capture_graphs_at_start:
        yield _problem(("engine.capture_graphs_when_idle", "engine.capture_graphs_at_start"),
                       "every graph is captured as the instance starts: none is left for idle time",
                       "set engine.capture_graphs_when_idle=auto")  # fmt: skip


GPU_PATH_RULES = (warm_up_applies, prefetch_to_device_applies, graph_capture_applies)
