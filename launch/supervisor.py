"""The supervisor: starts a run's actors in order, watches them, restarts or ends the run.

    1. run directory + resolved config; bus proxy (in this process); CURVE keys across hosts
    2. logger first (so every later event is logged), then every other actor; wait for READY
    3. watch: process exits and missed heartbeats (a death is seen within ~2 s), restart policy,
       every start / death / restart published as an event; progress shown on the console; a
       replacement is forked from the fork server, or where none serves, once every actor serves, warm
       spares are started (topology.warm_spares per host, low priority) and a replacement becomes one
       when one is ready (launch.spares)
    4. stop in order (coordinator first, logger last) on RunFinished, Ctrl-C / SIGTERM or a fatal
       death; stragglers get SIGTERM then SIGKILL; remote ones are killed by pid over ssh

The exit code says how the run ended: 0 finished, 1 failed, 130 interrupted.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import zmq

from actors.boot import CHECKPOINT_ON_STOP, Boot, read_curve_files
from bus import BusProxy, Publisher, Subscriber
from bus.addresses import ipc_dir, plan_addresses
from bus.eventlog.format import newest_segment
from bus.messages import (
    ActorDead,
    ActorExited,
    ActorRestarted,
    ActorStarted,
    ActorStatus,
    Heartbeat,
    Hello,
    InstanceDrained,
    Ready,
    RunFinished,
    ScaleRequest,
    Shutdown,
    StallDiagnosed,
    TrainerProgress,
)
from bus.schema import Event
from bus.security import generate_keys, load_keys
from launch.cpu_placement import CpuPlacement, places_cores
from launch.forkserver import ForkServer
from launch.hosts import HostsFile
from launch.liveness import Liveness
from launch.placement import boot_run_dir, memory_saver_preload, visible_gpus
from launch.plan import ActorSpec, plan_actors, plan_endpoints
from launch.policy import RestartPolicy, RestartVerdict
from launch.process import ActorProcess, run_on_host, start_actor
from launch.scale import ScaleController
from launch.scale_placement import RolloutPlacement, default_placement
from launch.spare_policy import SparePolicy
from launch.spares import SparePool
from launch.stall import SUBSCRIPTIONS as STALL_SUBSCRIPTIONS
from launch.stall import RunStallWatch
from launch.stopping import StoppingActor, grace_end
from psrl.checkpoint_dirs import latest_checkpoint, read_trainer_state, remove_snapshots
from psrl.config import Config, to_yaml
from psrl.config.bus_settings import bus_settings
from psrl.coordination.scaling import RUN_STATE_REFUSAL
from psrl.launches import INCARNATIONS_PER_LAUNCH, is_replacement
from psrl.log import get_logger
from psrl.ps.from_config import resolve_transport
from psrl.reliability.stall import END
from psrl.rundir import RunDir

WATCH_INTERVAL_S = 0.1
SUBSCRIBE_WAIT_S = 10.0
DEATH_REASON_WAIT_S = 0.3  # for a dead actor's last event, which may trail its exit
FORK_SERVER_WAIT_S = 60.0  # for its imports, before actors start without it (a very loaded host)
SHUTDOWN_GRACE_S = 6.0  # for actors to exit after Shutdown (all stages together), before SIGTERM
# but at least this long for each stage: a GPU actor takes 1-2 s to exit (CUDA teardown), and a
# late stage (the PS, the event log) must not lose its grace to the stages before it
STAGE_GRACE_S = 3.0
TERM_GRACE_S = 1.5  # after SIGTERM, before SIGKILL

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130
STOP_STAGES = (("coordinator", "session"), ("router",), ("trainer",), ("rollout",), ("ps",), ("logger",))

Listener = Callable[[Event[Any]], None]


class HandshakeTimeoutError(RuntimeError):
    """Some actors did not report ready in time."""


class Supervisor:
    def __init__(
        self,
        config: Config,
        run_dir: RunDir,
        hosts: HostsFile | None = None,
        *,
        listeners: tuple[Listener, ...] = (),
        actor_options: dict[str, Any] | None = None,
        fork_server_ahead: ForkServer | None = None,
    ) -> None:
        multi = hosts is not None and hosts.spans_hosts
        self.config, transport = resolve_transport(config, spans_hosts=multi)
        config = self.config
        self.fork_server_ahead = fork_server_ahead  # started before the config was read: taken if it fits
        self.run_dir = run_dir
        self.hosts = hosts
        self.listeners = listeners
        self.actor_options = actor_options or {}
        self.log = get_logger("psrl.launch", run=run_dir.name)
        self.specs = plan_actors(config, hosts)
        self.processes: dict[str, ActorProcess] = {}
        self.policy = RestartPolicy()
        self.num_restarts: dict[str, int] = {}
        self.end_reason: str | None = None
        self.exit_code = EXIT_OK
        self.is_stopping = False
        self._last_check = time.monotonic()  # when the watch loop last looked at heartbeats
        self._in_stall = False
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.dead_reasons: dict[str, str] = {}
        self.spares: SparePool | None = None
        self.stall: RunStallWatch | None = None
        self.fork_server: ForkServer | None = None
        # where `psrl scale` starts new rollout instances (a cluster placement may set its own before run())
        self.rollout_placement: RolloutPlacement = default_placement(config, hosts)
        self.scaler: ScaleController | None = None
        is_local = hosts is None or all(h.is_local for h in hosts.hosts)
        yields = config.topology.cpu_placement == "auto"
        self.cpu_placement = CpuPlacement(self.log, yields_to_others=yields) if places_cores(config, is_local) else None
        self.log.info("weight transport", transport=transport.name, reason=transport.reason)

    # ------------------------------------------------------------------ public

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self.run_dir.write_config(to_yaml(self.config))
        # A resumed run's actors continue the incarnation numbering, so every event id stays unique.
        launches = int(self.run_dir.read_state().get("launches", 0))
        self.incarnation_base = launches * INCARNATIONS_PER_LAUNCH
        self.run_dir.write_state(status="starting", started_at=time.time(), launcher_pid=_pid(), launches=launches + 1)
        # shard snapshots serve restarts within a launch; a resumed run's trainer pushes from its checkpoint
        remove_snapshots(self.run_dir.path / "ps")
        try:
            self._start_bus()
            self._start_all()
            self.spares = self._spare_pool()
            self.scaler = self._scale_controller()
            if not self.is_stopping:
                self.run_dir.write_state(status="running")
                self._watch()
        except HandshakeTimeoutError as exc:
            self._end(EXIT_FAILED, str(exc))
        except Exception as exc:
            self.log.error("launcher failed", error=repr(exc))
            self._end(EXIT_FAILED, f"launcher error: {exc!r}")
        finally:
            self._stop_all()
            if self.fork_server is not None:
                self.fork_server.close()
            if self.fork_server_ahead is not None:  # the run ended before it started its actors
                self.fork_server_ahead.discard()
            self._stop_bus()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        status = {EXIT_OK: "finished", EXIT_INTERRUPTED: "interrupted"}.get(self.exit_code, "failed")
        if self.exit_code == EXIT_OK:  # a finished run needs no shard snapshots (each a whole model part)
            remove_snapshots(self.run_dir.path / "ps")
        self.run_dir.write_state(status=status, ended_at=time.time(), exit_code=self.exit_code, reason=self.end_reason)
        return self.exit_code

    # ------------------------------------------------------------------ bus

    def _start_bus(self) -> None:
        multi = self.hosts is not None and self.hosts.spans_hosts
        curve_mode = self.config.bus.curve
        self.curve_files: dict[str, str] = {}
        curve = None
        if curve_mode == "on" or (curve_mode == "auto" and multi):
            if not (self.run_dir.keys / "server.key_secret").exists():
                generate_keys(self.run_dir.keys)
            curve = load_keys(self.run_dir.keys)
            self.curve_files = read_curve_files(self.run_dir.keys)
        self.settings = bus_settings(self.config, curve)
        transport = "tcp" if multi else self.config.bus.transport
        host = self._launcher_address() if multi else self.config.bus.host
        plan = plan_addresses(self.run_dir.path, transport, host, str(self.run_dir.keys) if curve else None)
        self.proxy = BusProxy(plan, self.settings.options, self.ctx)
        self.addresses = self.proxy.start()
        self.addresses.save(self.run_dir.path)
        # kept: an instance added later (psrl scale) takes the next slot's endpoints
        self.plan_endpoints = functools.partial(
            plan_endpoints,
            use_tcp=multi or transport == "tcp",
            ipc_directory=str(ipc_dir(self.run_dir.path)),
            base_port=self.config.bus.base_port,
            local_address=host,
        )
        self.endpoints = self.plan_endpoints(self.specs)
        self.dist_master = _dist_master(self.endpoints)
        resume = self.config.trainer.resume
        self.resume = resume_point(self.run_dir, self.config.entries_per_buffer) if resume else ResumePoint()
        if self.resume.version:
            self.log.info("resuming", version=self.resume.version, next_prompt_id=self.resume.next_prompt_id)
        # this launch's logger starts the log's next segment: the launch's events are there and after
        self.log_segment = newest_segment(self.run_dir.events) + 1
        self.publisher = Publisher(
            self.ctx, self.addresses, "supervisor", self.incarnation_base, options=self.settings.options
        )
        self.watcher = Subscriber(
            self.ctx,
            self.addresses.events_out,
            # session.env_worker: env worker replacements, for listeners (the chaos harness waits on them)
            [
                "actor.",
                "run.",
                "train.progress",
                "obs.metrics",
                "inst.status",
                "sup.",
                "session.env_worker",
                InstanceDrained.KIND,  # a retiring instance (psrl scale) may stop
                *STALL_SUBSCRIPTIONS,
            ],
            options=self.settings.options,
            name="supervisor",
        )
        self.control_watcher = Subscriber(
            self.ctx,
            self.addresses.control_out,
            # coord.sync: a moment chaos plans time faults against (launch.chaos); ctl.scale: psrl scale
            ["run.", "coord.sync", ScaleRequest.KIND],
            options=self.settings.options,
            name="supervisor:control",
        )

    def _launcher_address(self) -> str:
        if self.hosts is not None:
            for host in self.hosts.hosts:
                if host.is_local:
                    return host.address
        return self.config.bus.host

    def _stop_bus(self) -> None:
        for closer in ("watcher", "control_watcher", "publisher"):
            obj = getattr(self, closer, None)
            if obj is not None:
                obj.close()
        proxy = getattr(self, "proxy", None)
        if proxy is not None:
            proxy.stop()
        self.ctx.destroy(linger=0)

    # ------------------------------------------------------------------ start

    def _boot(self, spec: ActorSpec, incarnation: int) -> Boot:
        bus = {k: v for k, v in vars(self.addresses).items() if k != "curve_dir"}
        return Boot(
            name=spec.name,
            role=spec.role,
            index=spec.index,
            incarnation=incarnation,
            config_yaml=to_yaml(self.config),
            bus=bus,
            endpoints=self.endpoints,
            host=spec.host.address if spec.host is not None else self.config.bus.host,
            run_dir=boot_run_dir(spec.host, self.run_dir.path),
            curve_files=self.curve_files,
            options={
                "log_level": self.config.run.log_level,
                "dist_master": self.dist_master,
                "torch_threads": _torch_threads(spec.role, self.config),
                # the router's ledger and the coordinator's buffers and prompt cursor continue from here
                "initial_version": self.resume.version,
                "first_prompt_id": self.resume.next_prompt_id,
                "log_segment": self.log_segment,
                # a replacement within this launch: the rest of the run is ahead of its checkpoint
                "restarted": is_replacement(incarnation),
                **_placement(spec, self.config),
                **self.actor_options.get(spec.name, {}),
            },
        )

    def _start(self, spec: ActorSpec, incarnation: int, *, announce: bool = True) -> ActorProcess:
        boot, log_file = self._boot(spec, incarnation), self.run_dir.log_file(spec.name)
        process = self.spares.take(spec, boot, log_file) if self.spares is not None else None
        if process is None and self.fork_server is not None and _is_local(spec):
            process = self.fork_server.start(spec, boot, log_file, self._actor_class(spec))
        if process is None:
            process = start_actor(spec, boot, log_file)
        self.processes[spec.name] = process
        if announce:
            self._announce(process)
        return process

    def _announce(self, process: ActorProcess) -> None:
        spec = process.spec
        self.publisher.publish(
            ActorStarted(spec.name, process.incarnation, process.popen.pid, spec.host_name, warm=process.warm)
        )
        self.log.info("started", actor=spec.name, incarnation=process.incarnation, host=spec.host_name,
                      warm=process.warm)  # fmt: skip

    def _start_all(self) -> None:
        logger = [s for s in self.specs if s.role == "logger"]
        others = [s for s in self.specs if s.role != "logger"]
        self.fork_server = self._start_fork_server(others)  # imports while the logger starts
        for spec in logger:
            self._start(spec, self.incarnation_base, announce=False)
        self._await_ready([s.name for s in logger])
        self.publisher.wait_subscribed(SUBSCRIBE_WAIT_S, prefix="")
        for spec in logger:  # announced once the log listens
            self._announce(self.processes[spec.name])
        for spec in self._in_import_order(others):
            self._start(spec, self.incarnation_base)
        self._await_ready([s.name for s in others])

    def _in_import_order(self, specs: list[ActorSpec]) -> Iterator[ActorSpec]:
        """``specs`` as the fork server's classes become ready, each class's local actors as soon as it is
        (the trainer's first: the first step waits for it); the others, and all without a server, at once."""
        server = self.fork_server
        if server is None:
            yield from specs
            return
        forked = [s for s in specs if _is_local(s) and self._actor_class(s) in server.classes]
        yield from (s for s in specs if s not in forked)
        for target in server.classes:
            group = [s for s in forked if self._actor_class(s) == target]
            if group and not server.wait_class(target, FORK_SERVER_WAIT_S):
                self.log.warning("fork server not ready; actors start as fresh interpreters", actor_class=target,
                                 log=str(self.run_dir.log_file("forkserver")))  # fmt: skip
            yield from group

    def _actor_class(self, spec: ActorSpec) -> str:
        """The class an actor runs (its role's, or the one its options name)."""
        return str(self.actor_options.get(spec.name, {}).get("actor_class", spec.role))

    def _start_fork_server(self, specs: list[ActorSpec]) -> ForkServer | None:
        """One process that imports the local actors' classes once and forks each of them (topology.fork_server)."""
        ahead, self.fork_server_ahead = self.fork_server_ahead, None
        local = [s for s in specs if _is_local(s)]
        classes: list[str] = []
        for spec in local:
            target = self._actor_class(spec)
            if target not in classes:
                classes.append(target)
        log_file, threads = self.run_dir.log_file("forkserver"), self.config.topology.threads_per_actor
        wanted = self.config.topology.fork_server and bool(local)
        if ahead is not None and wanted and ahead.adopt(classes, threads, log_file, ipc_dir(self.run_dir.path)):
            return ahead
        if ahead is not None:
            ahead.discard()
        return ForkServer(classes, threads, log_file, ipc_dir(self.run_dir.path)) if wanted else None

    def _spare_pool(self) -> SparePool | None:
        """Warm spares on the launching host, warming the classes of the actors that run there."""
        local = [s for s in self.specs if _is_local(s)]
        per_host = self.config.topology.warm_spares
        if not local or per_host == 0:
            return None
        classes: dict[str, list[str]] = {}
        for spec in local:
            target = str(self.actor_options.get(spec.name, {}).get("actor_class", spec.role))
            if target not in classes.setdefault(spec.host_name, []):
                classes[spec.host_name].append(target)
        log_dir = self.run_dir.log_file("spares").parent
        return SparePool(SparePolicy(per_host), classes, log_dir, self.config.topology.threads_per_actor)

    @property
    def keeps_spares(self) -> bool:
        """Whether warm spares are kept now: not while the fork server runs, whose forks are as warm; a spare's
        imports take CPU from the running actors (on 2 cores the demo's step was 1.3x as long while one warmed)."""
        return self.spares is not None and not (self.fork_server is not None and self.fork_server.is_alive)

    @property
    def spares_full(self) -> bool:
        """Every warm spare the run keeps is ready (true when it keeps none)."""
        return self.spares is None or not self.keeps_spares or self.spares.is_full()

    @property
    def spare_ready(self) -> bool:
        """A replacement now would start warm: a ready spare, or the fork server (true when the run keeps no
        spares: nothing to wait for)."""
        if self.spares is None or not self.keeps_spares:
            return True
        return self.spares.num_ready() > 0 or self.spares.is_full()

    def _await_ready(self, names: list[str]) -> None:
        deadline = time.monotonic() + self.config.bus.handshake_timeout_s
        while not self.is_stopping:
            missing = [n for n in names if not self.processes[n].is_ready]
            if not missing:
                return
            for name in missing:
                code = self.processes[name].poll()
                if code is not None:
                    reason = self._death_reason(name, code)
                    raise HandshakeTimeoutError(
                        f"{name} exited while starting ({reason}); see {self.run_dir.log_file(name)}"
                    )
            if time.monotonic() > deadline:
                raise HandshakeTimeoutError(
                    f"actors not ready after {self.config.bus.handshake_timeout_s:.0f} s: {', '.join(missing)} "
                    f"(logs in {self.run_dir.path / 'logs'})"
                )
            self._pump_events(WATCH_INTERVAL_S)

    # ------------------------------------------------------------------ watch

    def _watch(self) -> None:
        self._last_check = time.monotonic()
        self.stall = RunStallWatch(self.config, self.log, self.resume.version, self._last_check)
        while not self.is_stopping:
            self._pump_events(WATCH_INTERVAL_S)
            self._check_processes()
            self._check_stall()
            if self.scaler is not None:
                self.scaler.tick(time.monotonic())
            if self.spares is not None and self.keeps_spares:
                self.spares.tend(run_settled=self._is_settled())

    def _is_settled(self) -> bool:
        """Every actor serving and the run going on: a spare's imports then delay no start or recovery."""
        return not self.is_stopping and all(p.is_ready and p.poll() is None for p in self.processes.values())

    def _pump_events(self, timeout_s: float) -> None:
        poller = zmq.Poller()
        poller.register(self.watcher.socket, zmq.POLLIN)
        poller.register(self.control_watcher.socket, zmq.POLLIN)
        ready = dict(poller.poll(int(timeout_s * 1000)))
        while ready:
            for sub in (self.control_watcher, self.watcher):
                if sub.socket in ready:
                    for event in sub.recv_batch(0):
                        self._on_event(event)
            ready = dict(poller.poll(0))

    def _on_event(self, event: Event[Any]) -> None:
        msg, sender = event.message, event.envelope.sender
        name = sender.split("/", 1)[0]  # heartbeats (/hb) and control events (/ctl) come from the actor
        process = self.processes.get(name)
        if process is not None and event.envelope.incarnation == process.incarnation:
            self._on_actor_event(name, process, msg)
        if isinstance(msg, RunFinished):
            self._end(EXIT_OK if msg.success else EXIT_FAILED, msg.reason or "run finished")
        elif isinstance(msg, ScaleRequest):
            self._on_scale_request(msg)
        elif isinstance(msg, InstanceDrained) and self.scaler is not None:
            self.scaler.on_drained(msg)
        if self.stall is not None:
            self.stall.observe(event, time.monotonic())
        for listener in self.listeners:
            listener(event)

    def _on_actor_event(self, name: str, process: ActorProcess, msg: Any) -> None:
        """An event from the current incarnation of one of the run's actors."""
        if isinstance(msg, Heartbeat):
            process.last_heartbeat = time.monotonic()
        elif isinstance(msg, Hello):
            process.remote_pid = msg.pid
            process.last_heartbeat = time.monotonic()
        elif isinstance(msg, Ready):
            process.is_ready = True
            process.last_heartbeat = time.monotonic()
            if self.scaler is not None:
                self.scaler.joined(name)
        elif isinstance(msg, ActorDead):
            self.dead_reasons[name] = msg.reason
        elif isinstance(msg, ActorStatus) and msg.detail == CHECKPOINT_ON_STOP:
            process.saving_since = time.monotonic()
        elif isinstance(msg, TrainerProgress):
            process.last_step_s = msg.step_s
            if self.cpu_placement is not None and name == "trainer-0":
                others = [p.pid for n, p in self.processes.items() if n != name and p.poll() is None]
                self.cpu_placement.update(process.pid, others, self._helper_pids())

    def _helper_pids(self) -> list[int]:
        """The run's processes that are not actors: the fork server and the warm spares."""
        spares = [s.popen.pid for s in self.spares.spares.values()] if self.spares is not None else []
        return [self.fork_server.popen.pid, *spares] if self.fork_server is not None else spares

    def _check_processes(self) -> None:
        now = time.monotonic()
        watcher_gap_s, self._last_check = now - self._last_check, now
        limit_s = self.config.bus.heartbeat_interval_ms * self.config.bus.heartbeat_misses / 1000
        liveness = Liveness(limit_s)
        silences = {n: now - p.last_heartbeat for n, p in self.processes.items() if p.is_ready and p.poll() is None}
        self._note_stall(liveness, silences, watcher_gap_s)
        silent = set(liveness.dead(silences, watcher_gap_s))
        for name, process in list(self.processes.items()):
            code = process.poll()
            if code is None and name in silent:
                self.log.warning("missed heartbeats", actor=name, silent_s=round(now - process.last_heartbeat, 2))
                process.signal(signal.SIGKILL)
                process.wait(2.0)
                code = process.poll()
                self.dead_reasons.setdefault(name, f"no heartbeat for {now - process.last_heartbeat:.1f} s")
            if code is not None:
                self._on_death(process, code)

    def _check_stall(self) -> None:
        """No training step for ``run.stall_timeout_s`` while work waits: say who holds it, restart them
        once, then end the run (the trainer checkpoints on the way out, so it resumes)."""
        found = self.stall.check(time.monotonic()) if self.stall is not None else None
        if found is None:
            return
        diagnosis, action, silent_s = found
        holders = [h for h in diagnosis.holders if h in self.processes]
        self.publisher.publish(StallDiagnosed(list(diagnosis.holders), diagnosis.waits_for, silent_s, action,
                                              diagnosis.facts))  # fmt: skip
        self.log.error("no training step", silent_s=round(silent_s), holders=list(diagnosis.holders),
                       waiting_for=diagnosis.waits_for, action=action, facts=diagnosis.facts)  # fmt: skip
        if action == END or not holders:
            resume = f"psrl launch <same preset and overrides> --name {self.run_dir.name}"
            self._end(EXIT_FAILED, f"stalled: no training step for {silent_s:.0f} s; {', '.join(diagnosis.holders)} "
                      f"waited for {diagnosis.waits_for}; a restart did not help. Resume with: {resume}")  # fmt: skip
            return
        for name in holders:
            self.dead_reasons[name] = f"stalled: waited for {diagnosis.waits_for}"
            self._log_stacks(self.processes[name], "actor stalled; its threads")
            self.processes[name].signal(signal.SIGKILL)

    def _note_stall(self, liveness: Liveness, silences: dict[str, float], watcher_gap_s: float) -> None:
        """Logs once per episode that actors went silent together (the machine, not them: see launch.liveness)."""
        overdue = max(silences.values(), default=0.0) > liveness.limit_s
        stalled = overdue and liveness.is_machine_stall(silences, watcher_gap_s)
        if stalled and not self._in_stall:
            late = {name: round(s, 2) for name, s in silences.items() if s > liveness.limit_s / 2}
            self.log.warning("machine stall: actors silent together get a longer heartbeat limit",
                             watcher_gap_s=round(watcher_gap_s, 2), silent_s=late)  # fmt: skip
        self._in_stall = stalled

    def _death_reason(self, name: str, code: int) -> str:
        """Why ``name`` died: its last event (``actor.dead``) may still be on its way when the exit is
        seen, so the events are read once more before settling for the exit code."""
        if name not in self.dead_reasons and code > 0:  # a signal leaves no last event to wait for
            deadline = time.monotonic() + DEATH_REASON_WAIT_S
            while name not in self.dead_reasons and time.monotonic() < deadline:
                self._pump_events(0.02)
        return self.dead_reasons.get(name, f"exit code {code}")

    def _on_death(self, process: ActorProcess, code: int) -> None:
        spec = process.spec
        self.publisher.publish(ActorExited(spec.name, process.incarnation, code))
        reason = self._death_reason(spec.name, code)
        self.dead_reasons.pop(spec.name, None)
        if self.scaler is not None and spec.name in self.scaler.retiring:
            self.log.info("retired instance exited", actor=spec.name, incarnation=process.incarnation, reason=reason)
        else:
            self.log.warning("actor died", actor=spec.name, incarnation=process.incarnation, reason=reason)
        process.close_stdin()
        process.log.close()
        if self._leaves_the_set(spec.name, reason):
            return
        verdict, why = self.policy.decide(spec.name, spec.role, time.monotonic(), shutting_down=self.is_stopping)
        if verdict is RestartVerdict.RESTART:
            self.num_restarts[spec.name] = self.num_restarts.get(spec.name, 0) + 1
            new = self._start(spec, process.incarnation + 1)
            self.publisher.publish(
                ActorRestarted(
                    spec.name, process.incarnation, new.incarnation, self.num_restarts[spec.name], f"{reason}; {why}"
                )
            )
        elif verdict is RestartVerdict.END_RUN:
            del self.processes[spec.name]
            self._end(EXIT_FAILED, f"{spec.name} died ({reason}): {why}")

    # ------------------------------------------------------------------ elastic rollout (launch.scale)

    def _scale_controller(self) -> ScaleController:
        return ScaleController(
            self.rollout_placement,
            self.publisher.publish,
            self._start_added,
            self.processes,
            self.config.topology.drain_timeout_s,
            restart_rollout=self.config.topology.restart_rollout,
        )

    def _on_scale_request(self, request: ScaleRequest) -> None:
        if self.scaler is None:  # still starting: not answered yet (the asker re-sends until it is)
            return
        refuse = ""
        if self.is_stopping:
            refuse = f"{RUN_STATE_REFUSAL}it is stopping ({self.end_reason})"
        elif self.config.topology.colocate:
            refuse = (f"{RUN_STATE_REFUSAL}topology.colocate=true: its instances share the trainer's GPUs "
                      "and cannot be added or removed; launch without colocate to scale")  # fmt: skip
        self.scaler.on_request(request, refuse=refuse)

    def _start_added(self, spec: ActorSpec) -> ActorProcess:
        """A new instance of this launch: its own endpoints, started as any actor, joining a running run."""
        sibling = next(s.name for s in self.specs if s.role == spec.role)  # its actor class, if one was given
        self.specs.append(spec)
        slot_endpoints = self.plan_endpoints(self.specs)
        self.endpoints.update({k: v for k, v in slot_endpoints.items() if k.split(".")[0] == spec.name})
        actor_class = self.actor_options.get(sibling, {}).get("actor_class")
        self.actor_options[spec.name] = {"joins_running": True, **({"actor_class": actor_class} if actor_class else {})}
        return self._start(spec, self.incarnation_base)

    def _leaves_the_set(self, name: str, reason: str) -> bool:
        """A retired instance's exit, or an instance lost for good (topology.restart_rollout=false): not
        restarted; the run fails only when no instance is left."""
        if self.scaler is None or self.is_stopping:
            return False
        if self.scaler.takes_death(name):
            return True
        if self.scaler.loses_for_good(name, reason) is None:
            return False
        if not self.scaler.active:
            self._end(EXIT_FAILED, f"{name} died ({reason}) and no rollout instance is left "
                      "(topology.restart_rollout=false); resume with psrl launch --name "
                      f"{self.run_dir.name}, or set topology.restart_rollout=true")  # fmt: skip
        return True

    # ------------------------------------------------------------------ stop

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._end(EXIT_INTERRUPTED, f"interrupted by {signal.Signals(signum).name}")

    def run_within(self, seconds: float, reason: str) -> int:
        """``run``, ended as failed with ``reason`` when it has not finished within ``seconds`` (a harness's
        deadline: a run that stops making progress ends with the reason instead of hanging the harness)."""
        deadline = threading.Timer(seconds, self.end, [reason])
        deadline.daemon = True
        deadline.start()
        try:
            return self.run()
        finally:
            deadline.cancel()

    def end(self, reason: str) -> None:
        """Stop the run from outside its loop (a harness's deadline); it ends as failed, with ``reason``."""
        self._end(EXIT_FAILED, reason)

    def interrupt(self, reason: str) -> None:
        """Stop the run from outside its loop as an operator's Ctrl-C would: gracefully, as interrupted."""
        self._end(EXIT_INTERRUPTED, reason)

    def _end(self, code: int, reason: str) -> None:
        if self.is_stopping:
            return
        self.is_stopping = True
        self.exit_code = code
        self.end_reason = reason
        self.log.info("ending run", code=code, reason=reason)

    def _stop_all(self) -> None:
        """Stop in stages, the order work flows: no new work first, the parameter server and the log last.

        All stages share one grace period, but each stage gets at least STAGE_GRACE_S; whatever is
        left when its grace runs out is terminated."""
        self.is_stopping = True
        if self.spares is not None:
            self.spares.stop_all()
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for roles in STOP_STAGES:
            group = [s.name for s in reversed(self.specs) if s.role in roles and s.name in self.processes]
            self._stop_group(group, max(deadline, time.monotonic() + STAGE_GRACE_S))
        self._check_log_complete()

    def _check_log_complete(self) -> None:
        """A logger that failed while the run stopped (its log's end unwritten: a full disk) fails the run."""
        for spec in self.specs:
            process = self.processes.get(spec.name)
            code = process.poll() if spec.role == "logger" and process is not None else None
            if code is not None and code > 0 and self.exit_code == EXIT_OK:
                reason = self.dead_reasons.get(spec.name, f"exit code {code}")
                self.exit_code = EXIT_FAILED
                self.end_reason = (f"{self.end_reason}; but the event log is incomplete: {spec.name} failed "
                                   f"while stopping ({reason}; see {self.run_dir.log_file(spec.name)})")  # fmt: skip
                self.log.error("event log incomplete", actor=spec.name, code=code)

    def _stop_group(self, names: list[str], deadline: float) -> None:
        if not names:
            return
        if hasattr(self, "publisher"):
            self.publisher.publish(Shutdown(targets=names, reason=self.end_reason or ""))
        asked = time.monotonic()
        while any(self.processes[n].poll() is None for n in names):
            if time.monotonic() >= self._grace_end(names, deadline, asked):
                break
            self._pump_events(0.05)  # still watching: a trainer may report that it is checkpointing
        for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 1.0)):
            alive = [self.processes[n] for n in names if self.processes[n].poll() is None]
            for process in alive:
                self.log.warning("forcing actor to stop", actor=process.spec.name, signal=sig.name)
                if sig == signal.SIGTERM:
                    self._log_stacks(process)
                process.signal(sig)
            for process in alive:
                process.wait(grace)
        for name in names:
            process = self.processes[name]
            process.close_stdin()
            if process.is_remote and process.remote_pid is not None:
                run_on_host(process.spec, f"kill -9 {process.remote_pid} 2>/dev/null; true")
            if not process.log.closed:
                process.log.close()

    def _log_stacks(self, process: ActorProcess, what: str = "actor did not stop; its threads") -> None:
        """Where an actor about to be forced out is stuck (its threads' stacks, also in its log)."""
        stacks = process.dump_stacks(self.run_dir.log_file(process.spec.name))
        if stacks.strip():
            self.log.warning(what, actor=process.spec.name, stacks=stacks.strip())

    def _grace_end(self, names: list[str], deadline: float, asked: float) -> float:
        """`deadline`, or later for a trainer that saves a checkpoint or may still be in a step (launch.stopping)."""
        now = time.monotonic()
        actors = [
            StoppingActor(p.saving_since, p.last_step_s, now - p.last_heartbeat)
            for p in (self.processes[n] for n in names)
        ]
        limit_s = self.config.bus.heartbeat_interval_ms * self.config.bus.heartbeat_misses / 1000
        return grace_end(actors, deadline, asked, self.config.trainer.stop_save_timeout_s, limit_s)


def _torch_threads(role: str, config: Config) -> int:
    """An actor's torch threads at start (an ``auto`` trainer starts with threads_per_actor and adapts)."""
    fixed = config.topology.trainer_threads
    if role == "trainer" and isinstance(fixed, int) and fixed > 0:
        return fixed
    return config.topology.threads_per_actor


def _pid() -> int:
    return os.getpid()


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run continues: the version and the dataset cursor of its latest checkpoint."""

    version: int = 0
    next_prompt_id: int = 0


def resume_point(run_dir: RunDir, entries_per_buffer: int) -> ResumePoint:
    """The latest complete checkpoint's version and prompt cursor (zeros for a fresh run); a checkpoint
    written before the cursor was recorded continues after every prompt its versions could have used."""
    latest = latest_checkpoint(run_dir.checkpoints)
    if latest is None:
        return ResumePoint()
    state = read_trainer_state(latest)
    version = int(state["version"])
    return ResumePoint(version, int(state.get("next_prompt_id", version * entries_per_buffer)))


def _dist_master(endpoints: dict[str, str]) -> str:
    """Rendezvous of the trainer ranks' process group: trainer-0's spare port, or a free local one."""
    address = endpoints.get("trainer-0.3", "")
    if address.startswith("tcp://"):
        return address.removeprefix("tcp://")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def _placement(spec: ActorSpec, config: Config) -> dict[str, str]:
    gpus = visible_gpus(spec.role, spec.index, config.topology, spec.host)
    options = {} if gpus is None else {"cuda_visible_devices": gpus}
    preload = memory_saver_preload(spec.role, config)
    return options if preload is None else {**options, "ld_preload": preload}


def _is_local(spec: ActorSpec) -> bool:
    return spec.host is None or spec.host.is_local
