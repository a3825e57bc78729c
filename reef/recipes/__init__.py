"""recipes: the methods a scenario learns by, one file each (docs/recipes.md).

`sao` (weights: single-rollout policy optimisation of a LoRA adapter), `ttt_discover` (weights:
complete groups of rollouts from a search harness), `openclaw_rl` (weights: sessions stitched
from traffic, a judge's vote on what happened next, no reports needed) and `skills` (the harness: rules and skills
from reported feedback, through the proposers in `proposers/`). A recipe decides which records
are eligible (counting why the others are dropped), how they form a batch and how a batch
becomes a candidate. A scenario is bound to one recipe for life (`recipes:` in the config: a
name from `reef.config.RECIPES`, or any recipe's dotted path). See docs/learning.md.
"""
