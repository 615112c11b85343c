"""Checkpoints written from a background thread: the snapshot is the saved version's even while training
goes on, the files are those of a blocking save, and a failed write surfaces on the trainer's thread."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from psrl.assets import DEMO_MODEL_DIR
from psrl.trainer import TrainerCore
from psrl.trainer.background import BackgroundJob
from psrl.trainer.checkpoint import read_trainer_state
from psrl.trainer.parallel import ParallelContext

from .trainer_helpers import make_buffer, trainer_config


def _files(directory: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {str(p.relative_to(directory)): load_file(str(p)) for p in sorted(directory.rglob("*.safetensors"))}


CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_a_snapshot_written_after_more_training_is_the_blocking_save_of_its_version(
    tiny_model_dir: Path, tmp_path: Path, device: str
) -> None:
    """On a GPU with room the snapshot is a copy there, moved to the host by the write: the training that goes on
    between them (its kernels queued behind the copy, then writing the live tensors) must not reach it."""
    core = TrainerCore(trainer_config([f"topology.device={device}"]), model_dir=tiny_model_dir,
                       parallel=ParallelContext(device=torch.device(device)))  # fmt: skip
    core.train_buffer(0, make_buffer(0))
    blocking = core.save_checkpoint(tmp_path / "blocking")
    snapshot = core.snapshot_checkpoint()
    assert (snapshot.ready is not None) == (device == "cuda")
    core.train_buffer(1, make_buffer(1))  # the live weights and optimizer state move on
    written = core.write_checkpoint(tmp_path / "background", snapshot)
    assert written.name == blocking.name == "step_00000001"
    expected, actual = _files(blocking), _files(written)
    assert expected.keys() == actual.keys() and expected
    for name, tensors in expected.items():
        # a tied LM head is stored once or twice depending on whether the state shares the embedding's memory
        # (the blocking save's host copy on a GPU does not); every tensor stored by both must be equal
        shared = tensors.keys() & actual[name].keys()
        assert shared and shared >= tensors.keys() - {"lm_head.weight"}, name
        assert all(torch.equal(tensors[k], actual[name][k]) for k in shared), name
    assert read_trainer_state(written) == read_trainer_state(blocking)
    resumed, reference = (TrainerCore(trainer_config(), model_dir=tiny_model_dir) for _ in range(2))
    resumed.load_checkpoint(written)
    reference.load_checkpoint(blocking)
    assert resumed.version == 1 and resumed.next_prompt_id == core.next_prompt_id - 100
    for name, tensor in reference.policy.raw.state_dict().items():
        assert torch.equal(tensor, resumed.policy.raw.state_dict()[name]), name
    want, got = reference.policy.optimizer.state_dict()["state"], resumed.policy.optimizer.state_dict()["state"]
    assert want.keys() == got.keys() and want
    for index, entries in want.items():
        assert entries.keys() == got[index].keys()
        assert all(torch.equal(torch.as_tensor(v), torch.as_tensor(got[index][k])) for k, v in entries.items())


def test_tied_weights_stay_one_tensor_in_the_snapshot() -> None:
    core = TrainerCore(trainer_config([f"model.path={DEMO_MODEL_DIR}"]))
    if not core.policy.raw.config.tie_word_embeddings:  # type: ignore[union-attr]
        pytest.skip("the demo model does not tie its embeddings")
    (_, model_state, _), *_ = core.snapshot_checkpoint().states
    embed = next(t for n, t in model_state.items() if n.endswith("embed_tokens.weight"))
    head = model_state.get("lm_head.weight")
    assert head is None or head.data_ptr() == embed.data_ptr()
    assert embed.data_ptr() != core.policy.raw.get_input_embeddings().weight.data_ptr()  # type: ignore[union-attr]


def test_the_writer_runs_one_write_at_a_time_and_raises_a_failure_on_the_callers_thread(tmp_path: Path) -> None:
    written: list[Path] = []
    writer: BackgroundJob[Path] = BackgroundJob(written.append, name="checkpoint-writer")
    release = threading.Event()
    writer.submit(lambda: (release.wait(5), tmp_path / "step_00000001")[1])
    assert writer.busy
    writer.reap()  # not finished: returns at once
    assert written == []
    release.set()
    writer.submit(lambda: tmp_path / "step_00000002")  # waits for the first
    assert written == [tmp_path / "step_00000001"]
    writer.wait()
    assert written[-1] == tmp_path / "step_00000002" and not writer.busy

    def fail() -> Path:
        raise OSError("disk full")

    writer.submit(fail)
    with pytest.raises(OSError, match="disk full"):
        writer.wait()
    writer.close()
