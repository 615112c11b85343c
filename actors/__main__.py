"""Actor process entry point: ``python -m actors`` reads its boot line from stdin and runs."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Callable

from actors.boot import Boot
from actors.registry import actor_class
from psrl.log import configure


def main() -> int:
    return run_boot(Boot.read())


def run_boot(boot: Boot) -> int:
    """Become the actor ``boot`` names and run it: the one boot path of a cold start and a warm spare."""
    prepare_process(boot)
    json_log = None
    if boot.run_dir is not None and boot.options.get("log_to_run_dir", True):
        json_log = os.path.join(boot.run_dir, "logs", f"{boot.name}.jsonl")
    configure(str(boot.options.get("log_level", "info")), json_file=json_log)
    cls = actor_class(str(boot.options.get("actor_class", boot.role)))
    actor = cls(boot)
    code = _run(actor.run, boot.name)
    if getattr(actor, "exit_without_interpreter_teardown", False):
        # everything the actor owns is released; what is left are library finalizers that can
        # outlast the launcher's stop grace (vLLM's runs a full garbage collection of its heap)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def prepare_process(boot: Boot) -> None:
    """Thread counts and the visible GPUs, set before the actor's torch work starts.

    A cold process sets them before torch is imported; a warm spare imported torch already, so
    the thread count is also applied to torch itself, and the GPUs only while CUDA is untouched
    (importing torch does not start CUDA: the device list is read when it first starts)."""
    quiet_progress_bars()
    # `kill -USR1 <pid>` writes every thread's stack to the actor's log (its stderr); the launcher
    # does so to an actor that does not stop when asked, before forcing it
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    threads = int(boot.options.get("torch_threads", 0))
    if threads:  # several actors share the machine's cores
        os.environ["OMP_NUM_THREADS"] = str(threads)
        os.environ["MKL_NUM_THREADS"] = str(threads)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(threads)
    gpus = boot.options.get("cuda_visible_devices")
    if gpus is not None:  # the actor's device is then its cuda:0
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            raise RuntimeError(f"{boot.name}: CUDA started before its devices ({gpus}) could be chosen")
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpus)


def quiet_progress_bars() -> None:
    """No download or weight-loading progress bars: in an actor's log file they are carriage-return noise
    around the structured lines (loads are logged as events). A forked or warm process imported the
    libraries already, so their switches are flipped too."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # untyped in transformers


def _run(run: Callable[[], int], name: str) -> int:
    """The actor's loop; under ``PSRL_PROFILE_DIR`` profiled, its statistics written to ``<dir>/<name>.prof``
    on exit (read them with ``python -m pstats``): where an actor's own Python time goes in a real run."""
    directory = os.environ.get("PSRL_PROFILE_DIR")
    if not directory:
        return int(run())
    import cProfile

    profiler = cProfile.Profile()
    try:
        return int(profiler.runcall(run))
    finally:
        os.makedirs(directory, exist_ok=True)
        profiler.dump_stats(os.path.join(directory, f"{name}.prof"))


if __name__ == "__main__":
    sys.exit(main())
