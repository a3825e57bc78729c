"""runtimes: what serves a release's content.

`base.Runtime` is the interface (`generate`, `load`, `unload`, `count_tokens`,
`served_models`). `embedded` runs SmolLM2-135M-Instruct (or the tiny test model) on the CPU and
gives token ids and log-probs stamped with their runtime load; `upstream` forwards to an OpenAI-
or Anthropic-compatible provider. `factory` builds the one the config asks for; `endpoint` is a
model Reef asks for itself (the LLM proposer, a judge). See docs/architecture.md.
"""
