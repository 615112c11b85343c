"""Learning correctness: held-out evaluation during a run and the per-step staleness certificate.

``planner``      when to evaluate, the evaluation requests and the metrics of a finished round
``passk``        the unbiased pass@k estimator
``certificate``  what each trained buffer was made of (built by the trainer, re-derived by replay)
"""
