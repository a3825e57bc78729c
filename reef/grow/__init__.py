"""grow: experience in, candidates out.

The generic learner loop (`learner.py`: report cursor, batch log, gate hand-off, recovery), the
`Recipe` protocol it drives (`recipe.py`), and the training primitives weights recipes use:
`training_client.py` in the serving process, `worker.py` for the training process,
`trainer.py`, `losses.py` and `checkpoint.py` inside it (the only modules that import torch).
See docs/recipes.md, docs/learning.md and docs/architecture.md.
"""
