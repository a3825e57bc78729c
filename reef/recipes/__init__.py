"""recipes: the methods of learning, one file each (docs/recipes.md).

`sao` (weights: single-rollout policy gradient), `ttt_discover` (weights: complete groups of
rollouts from a search harness) and `skills` (harness: a proposer turns recurring failures into
rules and skills, `proposers/`). `reef.config.RECIPES` names the built-in ones;
any other recipe is named by its dotted path.
"""
