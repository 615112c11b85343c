"""Regional compilation of the trainer's layers: the same steps as eager, one build for every layer."""

from __future__ import annotations

import inspect
from functools import partial
from pathlib import Path

import pytest
import torch

from psrl.trainer import TrainerCore, core
from psrl.trainer.compiled import compile_enabled, compile_layers, transformer_layers

from .test_packing import assert_same_direction, assert_same_steps, captured_steps, samples_of
from .trainer_helpers import trainer_config


def test_auto_compiles_on_cuda_only_and_a_bad_value_names_the_field() -> None:
    assert compile_enabled("auto", torch.device("cuda")) and not compile_enabled("auto", torch.device("cpu"))
    assert compile_enabled(True, torch.device("cpu")) and not compile_enabled(False, torch.device("cuda"))
    with pytest.raises(ValueError, match=r"actor\.compile=.sometimes."):
        compile_enabled("sometimes", torch.device("cpu"))  # type: ignore[arg-type]


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_compiled_layers_give_the_eager_step(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, packing: bool
) -> None:
    # aot_eager traces each layer exactly as inductor would (graphs, graph breaks, dynamic shapes,
    # autograd through checkpointed layers) and runs the traced graph without building kernels
    monkeypatch.setattr(core, "compile_layers", partial(compile_layers, backend="aot_eager"))
    torch._dynamo.reset()
    overrides = [f"actor.packing={packing}", "actor.gradient_checkpointing=True", "algorithm.entropy_coeff=0.01",
                 "actor.use_dynamic_bsz=True", "actor.ppo_max_token_len_per_gpu=40"]  # fmt: skip
    compiled = TrainerCore(trainer_config([*overrides, "actor.compile=True"]), model_dir=tiny_model_dir)
    eager = TrainerCore(trainer_config([*overrides, "actor.compile=False"]), model_dir=tiny_model_dir)
    layers = transformer_layers(compiled.policy.raw)
    assert layers and all(layer._compiled_call_impl is not None for layer in layers)
    assert not any(layer._compiled_call_impl is not None for layer in transformer_layers(eager.policy.raw))
    assert compiled.policy.raw.state_dict().keys() == eager.policy.raw.state_dict().keys()  # what a sync pushes
    assert_same_steps(captured_steps(compiled, 2), captured_steps(eager, 2))


def test_every_layer_and_every_packed_length_share_one_graph_with_the_attention_inside(tiny_model_dir: Path) -> None:
    from torch._dynamo.utils import counters

    from psrl.trainer.forward import response_log_probs
    from psrl.trainer.models import load_policy
    from psrl.trainer.packing import pack
    from psrl.trainer.varlen import use_varlen_attention

    torch._dynamo.reset()
    counters.clear()
    model = load_policy(tiny_model_dir, torch.float32, torch.device("cpu"))
    use_varlen_attention(model)
    assert compile_layers(model, backend="aot_eager") == len(transformer_layers(model)) > 1

    def forward(lengths: list[tuple[int, int]]) -> None:
        with torch.no_grad():
            response_log_probs(model, pack(samples_of(lengths), pad_token_id=0))

    forward([(3, 4), (5, 2)])
    forward([(2, 9), (4, 1), (6, 6)])
    # one graph for a whole layer, its packed attention included: not one set per layer, no break around
    # the attention (which had split each layer into six graphs with Python frames between them)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    forward([(7, 20)])  # one sequence: torch specialises a dimension of size 1, so this is a graph of its own
    first = counters["stats"]["unique_graphs"]
    assert first == 2
    for lengths in ([(3, 3), (2, 2), (9, 31), (4, 4)], [(5, 13), (5, 14)], [(8, 2)]):  # new token counts, longest
        forward(lengths)
    assert counters["stats"]["unique_graphs"] == first and not counters["graph_break"]


class _TracedError(Exception):
    """Raised by the recording backend once it has the graph (the CPU cannot run the flash kernel)."""


def test_the_flash_kernel_is_traced_into_the_graph_with_no_break(monkeypatch: pytest.MonkeyPatch) -> None:
    varlen_module = pytest.importorskip("torch.nn.attention.varlen")
    from psrl.trainer import varlen

    # the flash path as on a GPU in bf16; tracing runs on fake tensors, so the kernel itself never runs here
    monkeypatch.setattr(varlen.FLASH, "kernel", varlen_module.varlen_attn)
    monkeypatch.setattr(varlen.FLASH, "parameters", frozenset(inspect.signature(varlen_module.varlen_attn).parameters))
    monkeypatch.setattr(varlen, "_flash_dtype", lambda query: torch.bfloat16)
    graphs: list[torch.fx.GraphModule] = []

    def record(graph: torch.fx.GraphModule, example: object) -> None:
        graphs.append(graph)
        raise _TracedError

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int) -> torch.Tensor:
        out, _ = varlen.varlen_attention(torch.nn.Module(), q * 2.0, k, v, None, cu_seq_lens_q=cu, max_length_q=longest)
        return out.float().sum()

    torch._dynamo.reset()
    q = torch.randn(1, 4, 30, 8, requires_grad=True)
    k, v = torch.randn(1, 2, 30, 8), torch.randn(1, 2, 30, 8)
    with pytest.raises(Exception, match="_TracedError"):
        torch.compile(attend, backend=record, fullgraph=True, dynamic=True)(q, k, v, torch.tensor([0, 12, 30]), 18)
    calls = [str(node.target) for graph in graphs for node in graph.graph.nodes if node.op == "call_function"]
    assert "torch_attn._varlen_attn" in calls, calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_inductor_compiled_step_on_the_gpu_in_bf16(tiny_model_dir: Path) -> None:
    from psrl.trainer.parallel import ParallelContext

    torch._dynamo.reset()
    cuda = ParallelContext(device=torch.device("cuda"))
    overrides = ["actor.compute_dtype=bfloat16", "topology.device=cuda", "algorithm.entropy_coeff=0.01"]
    compiled = TrainerCore(trainer_config([*overrides, "actor.compile=auto"]), model_dir=tiny_model_dir, parallel=cuda)
    eager = TrainerCore(trainer_config([*overrides, "actor.compile=False"]), model_dir=tiny_model_dir, parallel=cuda)
    assert all(layer._compiled_call_impl is not None for layer in transformer_layers(compiled.policy.raw))
    for x, y in zip(captured_steps(compiled, 2), captured_steps(eager, 2), strict=True):
        if "metrics" in x:
            continue
        for name in x:  # bf16 arithmetic fused differently
            assert_same_direction(x[name], y[name], name)  # type: ignore[arg-type]
