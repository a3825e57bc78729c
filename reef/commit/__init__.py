"""commit: evaluate candidates, publish releases, move heads by compare-and-swap."""
