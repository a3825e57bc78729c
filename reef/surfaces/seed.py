"""The harness a new scenario starts with: `harness.seed_dir` (or a per-scenario override).

Seed directories are read and validated once, when the server starts, so a typo in one stops
`reef serve` with the file it names instead of failing the first request of a scenario.
"""

from __future__ import annotations

from pathlib import Path

from reef.config import HarnessConfig
from reef.core.errors import InvalidInput
from reef.core.types import ArtifactKind, Candidate
from reef.surfaces.harness import HarnessTree


class HarnessSeeds:
    def __init__(self, config: HarnessConfig) -> None:
        self.config = config
        self._trees: dict[Path, HarnessTree] = {}
        dirs = [config.seed_dir, *(o.seed_dir for o in config.scenarios.values())]
        for directory in dirs:
            if directory is not None and directory not in self._trees:
                self._trees[directory] = _read(directory)

    def candidate_for(self, scenario: str) -> Candidate | None:
        """The creation content of a new scenario, or None to start empty."""
        directory = self.config.seed_dir_for(scenario)
        if directory is None:
            return None
        tree = self._trees[directory]
        kind = ArtifactKind.EMPTY if tree.is_empty else ArtifactKind.HARNESS
        return Candidate(tree.to_files(), kind, {"kind": "seed", "seed_dir": str(directory)})


def _read(directory: Path) -> HarnessTree:
    try:
        return HarnessTree.from_dir(directory)
    except InvalidInput as exc:
        raise InvalidInput(f"harness seed {directory}: {exc}") from None
