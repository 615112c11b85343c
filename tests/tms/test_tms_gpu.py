"""torch-memory-saver on CUDA: pausing frees the memory (cudaMemGetInfo), resuming restores it, and the
engine's greedy tokens, the trainer's loss on a fixed batch and captured CUDA graphs are the same after.

Needs a CUDA device and the gpu extra (``pip install 'psrl[gpu]'``). Run twice: plainly (hook mode
``torch``) and with the preload library (``LD_PRELOAD=$(python -c 'from psrl.tms.backend import
preload_library; print(preload_library())')``), which also releases captured CUDA graphs.
"""

from __future__ import annotations

import gc
import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from psrl.engine import Engine, EngineArgs, SamplingParams
from psrl.tms import ROLLOUT, TRAINER, SideMemory, managed_regions
from psrl.tms.backend import is_preloaded
from psrl.trainer import ParallelContext, TrainerCore
from tests.trainer.trainer_helpers import make_buffer, trainer_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("torch_memory_saver") is None, reason="needs the gpu extra"),
]
MIB = 2**20


PRELOADED = is_preloaded()


def _backend():  # type: ignore[no-untyped-def]
    from psrl.tms.backend import TorchMemorySaverBackend, hook_mode

    return TorchMemorySaverBackend(hook_mode(enable_cuda_graph=False))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # a cuBLAS handle and its workspace outside any region: every later matmul, in any region, shares them
    torch.ones(64, 64, device="cuda") @ torch.ones(64, 64, device="cuda")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                         tie_word_embeddings=False, pad_token_id=0, eos_token_id=1)  # fmt: skip
    directory = tmp_path_factory.mktemp("tms_model")
    Qwen2ForCausalLM(config).save_pretrained(str(directory))
    return directory


@pytest.fixture
def clean_gpu():  # type: ignore[no-untyped-def]
    yield
    gc.collect()
    torch.cuda.synchronize()


def _engine(model_dir: Path, *, graphs: bool, num_kv_blocks: int = 4096, dtype: str = "bfloat16") -> Engine:
    regions = managed_regions("all", ROLLOUT, enable_cuda_graph=graphs)
    args = EngineArgs(model_path=model_dir, dtype=dtype, device="cuda", num_kv_blocks=num_kv_blocks,  # type: ignore[arg-type]
                      block_size=16, max_num_seqs=16, cuda_graphs=True)  # fmt: skip
    return Engine(args, memory=SideMemory(ROLLOUT, regions, _backend()))


def _generate(
    engine: Engine, prompts: list[list[int]], *, max_tokens: int = 48, steps_before: int = 0
) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        engine.add_request(str(index), prompt, params)
    outputs: dict[str, list[int]] = {}
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        for result in engine.step().finished:
            outputs[result.request_id] = list(result.output_ids)
    return [outputs[str(i)] for i in range(len(prompts))]


PROMPTS = [[(7 * i + j) % 4000 + 2 for j in range(5 + 3 * i)] for i in range(6)]


def test_engine_pause_frees_memory_and_resume_gives_the_same_greedy_tokens(model_dir: Path, clean_gpu) -> None:
    engine = _engine(model_dir, graphs=False)
    before = _generate(engine, PROMPTS)
    kv_bytes = engine.runner.kv_cache.numel() * engine.runner.kv_cache.element_size()
    paused = engine.release_memory()
    assert paused.changed_bytes >= kv_bytes  # the KV cache and the weights went back to the device
    assert engine.step().outputs == []  # nothing runs while released
    resumed = engine.restore_memory()
    assert resumed.changed_bytes >= kv_bytes
    assert abs(resumed.changed_bytes - paused.changed_bytes) <= 64 * MIB
    assert _generate(engine, PROMPTS) == before


def test_engine_released_mid_generation_continues_exactly(model_dir: Path, clean_gpu) -> None:
    # float32: preempted sequences are prefilled again, and in bf16 a re-prefilled KV can differ in the last bit
    # from the one decode steps wrote, which may flip a greedy choice (as after any preemption)
    engine = _engine(model_dir, graphs=False, dtype="float32")
    expected = _generate(engine, PROMPTS, max_tokens=120)
    params = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)
    for index, prompt in enumerate(PROMPTS):
        engine.add_request(f"again-{index}", prompt, params)
    for _ in range(3):  # the prefill and a few decode rounds
        assert not engine.step().finished
    assert engine.scheduler.running, "the release must find running sequences"
    engine.release_memory()  # preempts the running sequences; their tokens stay
    engine.restore_memory()
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for result in engine.step().finished:
            outputs[result.request_id] = list(result.output_ids)
    assert [outputs[f"again-{i}"] for i in range(len(PROMPTS))] == expected


def test_decode_graphs_replay_after_a_resume(model_dir: Path, clean_gpu) -> None:
    engine = _engine(model_dir, graphs=PRELOADED)  # the graphs' own memory is released only when preloaded
    before = _generate(engine, PROMPTS)
    graphs = _captured_graphs(engine)
    assert graphs, f"decode path {engine.runner.decode_path} captured no CUDA graph"
    engine.release_memory()
    engine.restore_memory()
    assert _generate(engine, PROMPTS) == before
    assert _captured_graphs(engine) == graphs  # replayed, not captured again


def _captured_graphs(engine: Engine) -> dict[object, int]:
    runner = engine.runner
    if runner.rounds is not None:
        return {key: id(graph) for key, graph in runner.rounds._graphs.items() if graph is not None}
    assert runner.decode_graphs is not None
    return {key: id(e.graph) for key, e in runner.decode_graphs._entries.items() if e.graph is not None}


@pytest.mark.skipif(not PRELOADED, reason="releasing graph memory needs the library preloaded (LD_PRELOAD)")
def test_a_graph_captured_in_the_region_replays_after_its_memory_comes_back(clean_gpu) -> None:
    memory = SideMemory(ROLLOUT, managed_regions("all", ROLLOUT, enable_cuda_graph=True), _backend())
    x = torch.randn(2048, 2048, device="cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        (x @ x).relu_()  # warm-up
    torch.cuda.current_stream().wait_stream(stream)
    with memory.graph_capture(graph, torch.cuda.graph_pool_handle()):
        y = (x @ x).relu_() + 1  # intermediates live in the graph's pool: the cuda_graph region
    graph.replay()
    expected = y.clone()
    report = memory.pause()
    assert report.region_ms.keys() >= {"cuda_graph"} and report.changed_bytes >= 16 * MIB
    memory.resume()
    y.zero_()
    graph.replay()
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_trainer_pause_frees_memory_and_resume_restores_state_and_loss(model_dir: Path, clean_gpu) -> None:
    config = trainer_config(["actor.lr=0.0001"])
    memory = SideMemory(TRAINER, managed_regions("all", TRAINER), _backend())
    core = TrainerCore(
        config, model_dir=model_dir, parallel=ParallelContext(device=torch.device("cuda")), memory=memory
    )
    core.train_buffer(0, make_buffer(0))  # optimizer state and gradients exist now
    batch = torch.tensor([[(5 * i + 3 * j) % 4000 + 2 for j in range(64)] for i in range(4)], device="cuda")
    loss_before = _loss(core, batch)
    state_before = {k: v.detach().cpu().clone() for k, v in core.policy.raw.state_dict().items()}
    moments_before = [s["exp_avg"].cpu().clone() for s in core.policy.optimizer.state.values()]
    params_bytes = sum(p.numel() * p.element_size() for p in core.policy.raw.parameters())
    paused = core.memory.pause()
    assert paused.changed_bytes >= 3 * params_bytes  # weights, both Adam moments (and the gradients)
    with pytest.raises(Exception, match="released"):
        core.train_buffer(1, make_buffer(1))
    resumed = core.memory.resume()
    assert resumed.changed_bytes >= 3 * params_bytes
    assert _loss(core, batch) == loss_before
    after = core.policy.raw.state_dict()
    assert all(torch.equal(after[k].cpu(), v) for k, v in state_before.items())
    moments_after = [s["exp_avg"].cpu() for s in core.policy.optimizer.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(moments_after, moments_before, strict=True))
    core.train_buffer(1, make_buffer(1))  # and training goes on
    assert core.version == 2


def _loss(core: TrainerCore, batch: torch.Tensor) -> float:
    with torch.no_grad():
        logits = core.policy.raw(input_ids=batch).logits.float()
    return float(torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch[:, 1:].flatten()))
