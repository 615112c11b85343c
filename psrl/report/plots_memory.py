"""Plot of colocated runs (``topology.colocate``): which side held the GPU memory when, and how long each
pause and resume took (``tms.switched`` events)."""

from __future__ import annotations

from pathlib import Path

from psrl.report.figure import TIME_LABEL, finish, new_figure
from psrl.report.inputs import NoDataError, ReportInputs
from psrl.report.timeline import RunTimeline, SwitchMark

_SIDE_COLOURS = {"trainer": "tab:orange", "rollout": "tab:blue"}


def plot_memory_switches(inputs: ReportInputs, path: Path) -> None:
    line = inputs.timeline
    if not line.switches:
        raise NoDataError("no tms.switched events (the run was not colocated)")
    figure, (held_axes, time_axes) = new_figure(2)
    actors = sorted({mark.actor for mark in line.switches})
    for row, actor in enumerate(actors):
        marks = [m for m in line.switches if m.actor == actor]
        spans = resident_spans(marks, line)
        colour = _SIDE_COLOURS.get(marks[0].side, "grey")
        held_axes.broken_barh(spans, (row - 0.35, 0.7), color=colour, alpha=0.7)
    held_axes.set_yticks(range(len(actors)), actors)
    held_axes.set_ylabel("GPU memory held")
    for side, colour in _SIDE_COLOURS.items():
        for action, marker in (("pause", "v"), ("resume", "^")):
            marks = [m for m in line.switches if m.side == side and m.action == action and m.duration_ms > 0]
            if marks:
                times = [line.relative(m.time) for m in marks]
                time_axes.scatter(times, [m.duration_ms for m in marks], color=colour, marker=marker,
                                  label=f"{side} {action}")  # fmt: skip
    time_axes.set_ylabel("switch time (ms)")
    time_axes.set_xlabel(TIME_LABEL)
    finish(figure, path, f"{inputs.run_name}: GPU memory switches of colocated training and rollout")


def resident_spans(marks: list[SwitchMark], line: RunTimeline) -> list[tuple[float, float]]:
    """(start, width) spans, in run-relative seconds, during which one actor held its memory.

    An actor holds its memory from the start until its first pause, and from each resume (reported when
    done) until its next pause began (the report time less the pause's duration)."""
    spans = []
    held_from: float | None = 0.0
    for mark in sorted(marks, key=lambda m: m.time):
        done = line.relative(mark.time)
        if mark.action == "pause" and held_from is not None:
            began = done - mark.duration_ms / 1000
            spans.append((held_from, max(began - held_from, 0.0)))
            held_from = None
        elif mark.action == "resume" and held_from is None:
            held_from = done
    if held_from is not None:
        spans.append((held_from, max(line.relative(line.end) - held_from, 0.0)))
    return [span for span in spans if span[1] > 0]
