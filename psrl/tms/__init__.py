"""GPU memory sharing between training and rollout (``psrl.tms.*``, torch-memory-saver).

regions    which memory each side allocates inside which region, and which regions a range manages
switch     the colocated consume/generate cycle as a pure state machine: which side pauses and resumes
memory     a side's regions at run time: allocation contexts, pause and resume with their timings
backend    the torch-memory-saver backend (needs CUDA and the gpu extra)
"""

from psrl.tms.memory import MemoryBackend, SideMemory, SwitchReport
from psrl.tms.regions import ROLLOUT, SIDES, TRAINER, Region, managed_regions, managed_sides
from psrl.tms.switch import ColocationSwitch, SwitchCommand

__all__ = [
    "ROLLOUT",
    "SIDES",
    "TRAINER",
    "ColocationSwitch",
    "MemoryBackend",
    "Region",
    "SideMemory",
    "SwitchCommand",
    "SwitchReport",
    "managed_regions",
    "managed_sides",
]
