"""Scenarios as the server sees them: bound on first use, their head loaded into the runtime.

`ScenarioDirectory.admit(name, recipe, release_id)` is what a request calls first: it creates
the scenario on first use (bound for life to the recipe the config names for it, or refuses a
contradicting `x-reef-recipe` / `x-reef-release-id` with 409 before anything is created), makes
sure its serving release is loaded in the runtime, and returns the release the request is
frozen to, pinned so that a swap never unloads it while the request runs.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

from reef.commit.release_chain import ReleaseChain
from reef.commit.state import ReefState
from reef.config import HarnessConfig, RecipeConfig
from reef.core.canonical import check_scenario_name
from reef.core.errors import Conflict, NotFound
from reef.core.types import Release, ReleaseRef
from reef.runtimes.base import Runtime
from reef.surfaces.inject import HarnessInjector
from reef.surfaces.seed import HarnessSeeds


class ScenarioDirectory:
    def __init__(self, state: ReefState, runtime: Runtime, recipes: RecipeConfig,
                 harness: HarnessConfig | None = None) -> None:
        self.state = state
        self.runtime = runtime
        self.recipes = recipes
        harness = harness or HarnessConfig()
        self.harness = HarnessInjector(harness, state.artifacts)
        self.seeds = HarnessSeeds(harness)
        self._locks: dict[str, asyncio.Lock] = {}
        self._pins: Counter[str] = Counter()
        self.on_created: list[Callable[[str], Awaitable[None]]] = []  # e.g. start its learner

    async def start(self) -> None:
        """Load every existing scenario's head, so the first request after a restart is fast."""
        for name in self.state.scenarios():
            await self._ensure_loaded(self.state.chain(name))

    # -- admission ---------------------------------------------------------------------------

    @asynccontextmanager
    async def admit(self, name: str, recipe: str | None = None, release_id: str | None = None) -> AsyncIterator[ReleaseRef]:
        """Freeze the scenario's serving release for one request, pinned until it ends."""
        chain = await self.resolve(name, recipe, release_id)
        ref = chain.serving()
        if ref.runtime_load_id is None:
            ref = await self._ensure_loaded(chain)
        load_id = ref.runtime_load_id
        assert load_id is not None
        self._pins[load_id] += 1
        try:
            yield ref
        finally:
            self._pins[load_id] -= 1
            if not self._pins[load_id]:
                del self._pins[load_id]

    def pinned(self, runtime_load_id: str) -> int:
        return self._pins.get(runtime_load_id, 0)

    async def resolve(self, name: str, recipe: str | None = None, release_id: str | None = None) -> ReleaseChain:
        check_scenario_name(name)
        try:
            chain = self.state.chain(name)
        except NotFound:
            chain = await self.create(name, recipe, release_id)
        _check_request_binding(name, chain.binding, recipe, release_id)
        return chain

    async def create(self, name: str, recipe: str | None = None, release_id: str | None = None) -> ReleaseChain:
        """Create (or return, if the binding matches) a scenario and load its head."""
        check_scenario_name(name)
        bound_recipe = self.recipes.for_scenario(name)
        if recipe is not None and recipe != bound_recipe:
            raise Conflict(f"scenario {name!r} binds recipe {bound_recipe!r} (from the config); x-reef-recipe says {recipe!r}")
        async with self._lock(name):
            try:
                chain = self.state.chain(name)
                created = False
            except NotFound:
                seed = self.seeds.candidate_for(name) if release_id is None else None
                chain = await asyncio.to_thread(self.state.create, name, bound_recipe, release_id, seed)
                created = True
            _check_request_binding(name, chain.binding, recipe, release_id)
            await self._load_serving(chain)
        if created:
            for hook in self.on_created:
                await hook(name)
        return chain

    # -- swaps -------------------------------------------------------------------------------

    async def serve_release(self, chain: ReleaseChain, release: Release) -> ReleaseRef:
        """Load a release's content and move the serving pointer to it (a swap); the previous
        load is unloaded once no request pins it."""
        async with self._lock(chain.scenario):
            previous = await self._load_serving(chain)
            files = await asyncio.to_thread(self.state.artifacts.files, release.release_id)
            load_id = await self.runtime.load(release.content_id, files)
            self.harness.remember(release.content_id, files)
            ref = ReleaseRef(release.release_id, release.content_id, load_id)
            chain.advance(previous.release_id, ref)
        if previous.runtime_load_id and previous.runtime_load_id != load_id:
            asyncio.get_running_loop().create_task(self._unload_when_free(previous.runtime_load_id))
        return ref

    async def _unload_when_free(self, runtime_load_id: str) -> None:
        while self.pinned(runtime_load_id):
            await asyncio.sleep(0.05)
        await self.runtime.unload(runtime_load_id)

    async def _ensure_loaded(self, chain: ReleaseChain) -> ReleaseRef:
        ref = chain.serving()
        if ref.runtime_load_id is not None:
            return ref
        async with self._lock(chain.scenario):
            return await self._load_serving(chain)

    async def _load_serving(self, chain: ReleaseChain) -> ReleaseRef:
        """With the scenario's lock held: make sure the serving release has a runtime load."""
        ref = chain.serving()
        if ref.runtime_load_id is not None:
            return ref
        files = await asyncio.to_thread(self.state.artifacts.files, ref.release_id)
        load_id = await self.runtime.load(ref.content_id, files)
        self.harness.remember(ref.content_id, files)
        loaded = ReleaseRef(ref.release_id, ref.content_id, load_id)
        chain.advance(ref.release_id, loaded)
        return loaded

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())


def _check_request_binding(name: str, binding: dict, recipe: str | None, release_id: str | None) -> None:
    if recipe is not None and recipe != binding["recipe"]:
        raise Conflict(f"scenario {name!r} is bound to recipe {binding['recipe']!r}; x-reef-recipe says {recipe!r}")
    if release_id is not None and release_id != binding["starting_release_id"]:
        raise Conflict(
            f"scenario {name!r} started from release {binding['starting_release_id']!r}; x-reef-release-id says {release_id!r}"
        )
