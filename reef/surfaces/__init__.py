"""surfaces: what a release holds besides weights, and how it reaches the agent.

The harness tree (`harness.py`: system prompt, rules, skills), inject mode (`inject.py`), the
harness a new scenario starts with (`seed.py`), and the agent wrapper's install script and file
layouts (`agent_install.py`, `agent_layout.py`, `agent_wrapper.sh`). See docs/harness.md.
"""
