"""The algorithm of each actor as a flow: decoded messages and clock values in, effects out.

    RouterFlow        request queue, worker selection, partial rollout, the staleness ledger
    CoordinatorFlow   prompt groups, rewards, buffers to the trainer, sync and migration ticks
    InstanceFlow      a rollout instance around its engine: serve, stream, sync weights
    TrainerFlow       a trainer rank around its core: train chunks, ask for the push

A flow does no I/O and reads no clock: ``flow.handle(message, now)`` returns effects
(``psrl.flows.effects``: Send, Publish, PushWeights) and ``flow.timers()`` declares its periodic
work. The actors (``actors/``) are thin adapters that decode, call the flow and perform its
effects on the bus; the in-process driver (``psrl.flows.driver``), the simulator (``psrl.sim``) and
the unit tests drive the same flows over in-memory queues (``psrl.flows.local``).

Adding an input: a handler in the flow's ``handlers()`` (and the kind in ``BUS_KINDS`` if it is
published rather than sent to the flow). Adding an effect: see ``psrl.flows.effects``.
"""
