"""Reef: an inference server that learns while it serves.

The packages, lowest layer first; a package imports only from layers below its own
(tests/test_layers.py checks it):

    core                  plain types, errors, training data; no I/O
    config, client, extras settings (recipes resolved by name or dotted path); the HTTP client; optional installs
    observe, runtimes, ui the experience store; the engines that serve a release; the dashboard's files
    surfaces              what a release holds besides weights (the harness) and how it is applied
    commit                gate, the gate's lane, release chain, publishers
    grow                  learner loop, canary loop, Recipe protocol, training primitives
    recipes               one file per method of learning (sao, ttt_discover, openclaw_rl, skills)
    serve                 the HTTP server: requests, scenarios, learners started per scenario
    demo, cli, __main__   the edges
"""

__version__ = "0.1.0"
