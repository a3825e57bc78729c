"""grow: the learners and the training process.

A learner per learning scenario reads new reports since its cursor, lets the scenario's recipe
turn them into a batch (logged in the commit log before any work), and turns the batch into a
candidate: weights through the training process (`learner.py`; `worker.py` runs `trainer.py`
in a child process), the harness through a proposer (`harness_learner.py`). The candidate goes
to commit's publisher. `loop.py` is the step loop both learners run. See docs/learning.md and
docs/architecture.md.
"""
