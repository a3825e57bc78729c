"""The base of every settings model, and how a settings error reads."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

# Settings Reef once had, by dotted key: a config that still names one is told what became of it.
REMOVED_SETTINGS = {
    "learner.gate.overtake_after": "every verdict runs to its decision (one race, in which it fired once, "
    "never made it a default)",
    "learner.sao.baseline_decay": "the running score baseline's decay is 0.9 (no config set another)",
    "learner.ttt_discover.entropic_kl": "the entropic advantage's weights are ln 2 nats from uniform, the "
    "paper's value (no config set another)",
    "learner.ttt_discover.max_open_groups": "at most 256 incomplete groups wait (no config set another)",
    "learner.skills.llm.tries": "the LLM proposer is asked at most 3 times a batch (no config set another)",
    "learner.skills.max_pending": "at most 256 failures wait for a batch (no config set another)",
    "learner.skills.similarity": "distill groups feedback by a word overlap of 0.5 (no config set another)",
    "learner.skills.gate.max_holdout": "the gate's tasks are the 32 latest held-out records (no config set another)",
    "learner.skillclaw.gate.max_holdout": "the gate's tasks are the 32 latest held-out records (no config set another)",
    "traces.service_name": "spans name the service reef, or what OTEL_SERVICE_NAME says",
    **{
        f"learner.{recipe}.warmup_steps": "a fresh optimiser steps at the full rate from its first step "
        "(no config set another; a recipe's own AdamParams may still ramp up)"
        for recipe in ("sao", "ttt_discover", "openclaw_rl")
    },
}


class Strict(BaseModel):
    """Unknown keys are an error that names them, so a typo never silently falls back to a default."""

    model_config = ConfigDict(extra="forbid")


def explain_errors(exc: ValidationError, prefix: str = "") -> str:
    """Every problem of `exc` on one line, each named by its dotted key (`prefix` first: the
    section it was read under), e.g. "unknown key 'learner.gate.halvs'; serve.port: ..."."""
    problems = []
    for err in exc.errors():
        loc = prefix + ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden" and loc in REMOVED_SETTINGS:
            problems.append(f"'{loc}' was removed: {REMOVED_SETTINGS[loc]}; delete it from the config")
        elif err["type"] == "extra_forbidden":
            problems.append(f"unknown key '{loc}'")
        elif err["type"] == "value_error":  # our validators' own words; a model's name where they are
            message = str(err["ctx"]["error"])
            problems.append(message if message.startswith(loc) or "'" + loc in message else f"{loc}: {message}")
        else:
            problems.append(f"{loc}: {err['msg']}")
    return "; ".join(problems)
