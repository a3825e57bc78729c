"""surfaces: what a release contains besides weights, and how it is applied at serve time.

The harness tree (`harness.py`: system prompt, rules, skills as text files), inject mode
(`inject.py`: the serving harness in front of each request), seed directories (`seed.py`) and
the agent installer (`agent_install.py`, `agent_layout.py`).
"""
