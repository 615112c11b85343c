"""RL algorithms: trajectory and batch types, advantage estimators, losses, rollout correction, filters.

Import from the submodules: ``psrl.rl.trajectory`` is what the coordinator and router handle and
needs no torch; the tensor code (``batch``, ``advantages``, ``losses``, ...) is the trainer's.
"""
