import math
from pathlib import Path

import pytest

from psrl.report.tb_proto import ProtoError
from psrl.report.tensorboard import FILE_VERSION, TensorBoardWriter, event_files, read_event_file, read_scalars
from psrl.report.tfrecord import RecordError


def write_three_steps(directory: Path) -> Path:
    with TensorBoardWriter(directory) as writer:
        for step in range(3):
            writer.add_scalars(step, {"reward/mean": 0.25 * step, "loss": 1.0 / (step + 1)}, wall_time=100.0 + step)
        writer.add_scalars(9, {})  # nothing to write: no event
        return writer.path


def test_file_starts_with_version_and_holds_every_step(tmp_path: Path) -> None:
    path = write_three_steps(tmp_path / "run")
    assert "tfevents" in path.name
    events = read_event_file(path)
    assert events[0].file_version == FILE_VERSION
    assert [e.step for e in events[1:]] == [0, 1, 2]
    assert [e.wall_time for e in events[1:]] == [100.0, 101.0, 102.0]
    series = read_scalars(tmp_path / "run")
    assert [(p.step, p.value) for p in series["reward/mean"]] == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert series["loss"][2].value == pytest.approx(1 / 3)


def test_two_writers_make_two_files_read_together(tmp_path: Path) -> None:
    for step in (1, 2):
        with TensorBoardWriter(tmp_path) as writer:
            writer.add_scalars(step, {"x": float(step)})
    assert len(event_files(tmp_path)) == 2
    assert sorted(p.step for p in read_scalars(tmp_path)["x"]) == [1, 2]


def test_damaged_file_raises(tmp_path: Path) -> None:
    path = write_three_steps(tmp_path)
    data = bytearray(path.read_bytes())
    data[-6] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises((RecordError, ProtoError)):
        read_event_file(path)


@pytest.mark.slow
def test_tensorboard_reads_our_files(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with TensorBoardWriter(tmp_path / "trainer-0") as writer:
        for step in range(5):
            writer.add_scalars(step, {"actor/pg_loss": -0.5 * step, "reward/mean": step / 4}, wall_time=50.0 + step)
        writer.add_scalars(5, {"reward/mean": math.nan})
    accumulator = EventAccumulator(str(tmp_path / "trainer-0"))
    accumulator.Reload()
    assert set(accumulator.Tags()["scalars"]) == {"actor/pg_loss", "reward/mean"}
    loss = accumulator.Scalars("actor/pg_loss")
    assert [(s.step, s.value, s.wall_time) for s in loss] == [(i, -0.5 * i, 50.0 + i) for i in range(5)]
    reward = accumulator.Scalars("reward/mean")
    assert [s.value for s in reward[:5]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert math.isnan(reward[5].value)


@pytest.mark.slow
def test_tensorboard_server_path_reads_our_files(tmp_path: Path) -> None:
    """The loader the TensorBoard server uses turns simple_value into scalar-plugin tensors."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    for run in ("coordinator", "trainer-0"):
        with TensorBoardWriter(tmp_path / run) as writer:
            writer.add_scalars(1, {"reward/mean": 0.5}, wall_time=10.0)
            writer.add_scalars(2, {"reward/mean": 0.75}, wall_time=11.0)
    multiplexer = EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    assert set(multiplexer.Runs()) == {"coordinator", "trainer-0"}
    tensors = multiplexer.Tensors("trainer-0", "reward/mean")
    assert [(t.step, float(t.tensor_proto.float_val[0])) for t in tensors] == [(1, 0.5), (2, 0.75)]
    assert multiplexer.SummaryMetadata("trainer-0", "reward/mean").plugin_data.plugin_name == "scalars"
