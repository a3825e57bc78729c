"""Scenarios as the server sees them: bound on first use, their head loaded into the runtime.

`ScenarioDirectory.admit(name, recipe, release_id)` is what a request calls first: it creates
the scenario on first use (bound for life to the recipe the config names for it, or refuses a
contradicting `x-reef-recipe` / `x-reef-release-id` with 409 before anything is created; past
`limits.max_scenarios` scenarios, refuses with 403 and keeps nothing of the name), makes sure its
serving release is loaded in the runtime, and returns the release the request is frozen to,
pinned so that a swap never unloads it while the request runs.

`HeadFollower` keeps a front end on the head of a commit log it shares with others (PostgreSQL,
or the JSONL logs of a state directory several processes serve): woken by the log's watch (a
PostgreSQL notification; a log file that changed, `reef/commit/jsonl_heads.py`), and every
second regardless, it reads every scenario's last step, and for each that moved it serves the new
head (`follow_head`: fetch the content if this front end lacks it, load it, move the serving
pointer; the previous load is unloaded once no request of this front end pins it). Scenarios
another front end created become known here, and the `on_created` hooks run for each scenario
the first time the follower sees it (`Learning.ensure`, which is idempotent, wants its lease);
a scenario gone from the heads (another process archived it, reef/commit/archive.py) is
forgotten here too (`ScenarioDirectory.forget`: the `on_archived` hooks, its serving unloaded).
A head whose content this front end cannot read is not served: it keeps serving the last
release it has loaded (503 where it has none), says so (`reef/serve/unreachable.py`), and
tries again every second.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Awaitable, Callable, Iterator, Mapping, TypeVar

from reef.commit.release_chain import ReleaseChain
from reef.commit.state import ReefState
from reef.config import HarnessConfig, RecipeConfig
from reef.core.canonical import check_scenario_name, content_id_of
from reef.core.errors import Conflict, Forbidden, MissingArtifact, NotFound, ReefError
from reef.core.types import Release, ReleaseRef
from reef.runtimes.base import Runtime, loads_trained_weights
from reef.serve.unreachable import FIX, ReleaseUnreachable, UnreachableReleases
from reef.surfaces.inject import HarnessInjector
from reef.surfaces.seed import HarnessSeeds

T = TypeVar("T")
log = logging.getLogger("reef.follow")
FOLLOW_INTERVAL_S = 1.0  # a follower reads the heads this often even without a notification
DEFAULT_MAX_SCENARIOS = 1000  # limits.max_scenarios


class ScenarioDirectory:
    def __init__(
        self,
        state: ReefState,
        runtime: Runtime,
        recipes: RecipeConfig,
        harness: HarnessConfig | None = None,
        max_scenarios: int = DEFAULT_MAX_SCENARIOS,
    ) -> None:
        self.state = state
        self.runtime = runtime
        self.recipes = recipes
        self.max_scenarios = max_scenarios
        self._creating = asyncio.Lock()  # creations one at a time: two cannot both take the last place
        harness = harness or HarnessConfig()
        self.harness = HarnessInjector(harness, state.artifacts)
        self.seeds = HarnessSeeds(harness)
        self._locks: dict[str, asyncio.Lock] = {}
        self._pins: Counter[str] = Counter()
        self.canaries: dict[str, tuple[ReleaseRef, float]] = {}  # scenario -> (the canary, its fraction)
        self._random = random.Random()
        self.on_created: list[Callable[[str], Awaitable[None]]] = []  # e.g. start its learner
        self.on_archived: list[Callable[[str], Awaitable[None]]] = []  # e.g. stop its learner
        self.unreachable = UnreachableReleases()  # releases this front end cannot read, per scenario

    async def start(self) -> None:
        """Load every existing scenario's head, so the first request after a restart is fast."""
        for name in self.state.scenarios():
            try:
                await self._ensure_loaded(self.state.chain(name))
            except ReleaseUnreachable:
                continue  # recorded and logged; its requests get 503 until the follower can read it

    # -- admission ---------------------------------------------------------------------------

    @asynccontextmanager
    async def admit(
        self, name: str, recipe: str | None = None, release_id: str | None = None
    ) -> AsyncIterator[ReleaseRef]:
        """Freeze the scenario's serving release for one request, pinned until it ends."""
        chain = await self.resolve(name, recipe, release_id)
        ref = chain.serving()
        if ref.runtime_load_id is None:
            ref = await self._ensure_loaded(chain)
        canary = self.canaries.get(name)
        if canary is not None and release_id is None and self._random.random() < canary[1]:
            ref = canary[0]
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

    @contextmanager
    def pin(self, runtime_load_id: str | None) -> Iterator[None]:
        """Keep a load from being unloaded while held, as a request's admission does (the weights
        gate answers on the serving release's load: a rollback meanwhile must not pull it away)."""
        if runtime_load_id is None:
            yield
            return
        self._pins[runtime_load_id] += 1
        try:
            yield
        finally:
            self._pins[runtime_load_id] -= 1
            if not self._pins[runtime_load_id]:
                del self._pins[runtime_load_id]

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
        bound_recipe = self.recipes.for_scenario(name, loads_trained_weights(self.runtime))
        if recipe is not None and recipe != bound_recipe:
            raise Conflict(
                f"scenario {name!r} binds recipe {bound_recipe!r} (from the config); x-reef-recipe says {recipe!r}"
            )
        if not self._known(name):
            await self._check_room(name)  # before anything of the name is kept (its lock, below)
        async with self._lock(name):
            try:
                chain = self.state.chain(name)
                created = False
            except NotFound:
                async with self._creating:
                    await self._check_room(name)
                    seed = self.seeds.candidate_for(name) if release_id is None else None
                    chain = await asyncio.to_thread(self.state.create, name, bound_recipe, release_id, seed)
                created = True
            _check_request_binding(name, chain.binding, recipe, release_id)
            await self._load_serving(chain)
        if created:
            for hook in self.on_created:
                await hook(name)
        return chain

    def _known(self, name: str) -> bool:
        try:
            self.state.chain(name)
        except NotFound:
            return False
        return True

    async def _check_room(self, name: str) -> None:
        """`Forbidden` (403) when the state already holds `max_scenarios` scenarios."""
        count = await asyncio.to_thread(self.state.scenario_count)
        if count >= self.max_scenarios:
            raise Forbidden(
                f"scenario {name!r} was not created: this server already holds {count} scenarios, "
                f"its limit (limits.max_scenarios: {self.max_scenarios}); use an existing scenario "
                "or raise the limit"
            )

    # -- swaps -------------------------------------------------------------------------------

    async def serve_release(self, chain: ReleaseChain, release: Release) -> ReleaseRef:
        """Load a release's content and move the serving pointer to it (a swap); the previous
        load is unloaded once no request pins it. A release already served, or one the serving
        pointer has passed (the follower served a later step first), is not loaded again."""
        async with self._lock(chain.scenario):
            previous = await self._load_serving(chain)
            if previous.release_id == release.release_id or await asyncio.to_thread(
                lambda: chain.release(previous.release_id).step > release.step
            ):
                return previous
            ref = await self._swap(chain, previous, release)
        self._retire(previous, ref)
        return ref

    async def follow_head(self, chain: ReleaseChain) -> ReleaseRef | None:
        """Serve the chain's head if this front end serves an older release (another front end
        published, rolled back or promoted); the new ref, or None if it served the head already."""
        async with self._lock(chain.scenario):
            previous = await self._load_serving(chain)
            head = await asyncio.to_thread(chain.head)
            if head.release_id == previous.release_id:
                self.unreachable.clear(chain.scenario)
                return None
            try:
                ref = await self._swap(chain, previous, head)
            except MissingArtifact as exc:  # keep serving what is loaded; the follower tries again
                self.unreachable.note(chain.scenario, head.release_id, previous.release_id, str(exc))
                raise ReleaseUnreachable(
                    f"scenario {chain.scenario!r}: cannot read release {head.release_id} "
                    f"({exc}); serving release {previous.release_id} meanwhile"
                ) from exc
        self.unreachable.clear(chain.scenario)
        self._retire(previous, ref)
        return ref

    async def _swap(self, chain: ReleaseChain, previous: ReleaseRef, release: Release) -> ReleaseRef:
        """With the scenario's lock held: load `release` (fetched first if this front end lacks
        it) and move the serving pointer from `previous` to it."""
        files = await asyncio.to_thread(self.state.artifacts.files, release.release_id)
        load_id = await self.runtime.load(release.content_id, files)
        self.harness.remember(release.content_id, files)
        ref = ReleaseRef(release.release_id, release.content_id, load_id)
        await asyncio.to_thread(chain.advance, previous.release_id, ref)
        return ref

    async def retire(self, name: str, archive: Callable[[], Awaitable[T]]) -> T:
        """Run `archive` (which moves the scenario aside) while no creation or swap of it runs;
        then stop its canary and unload what served it once no request pins it."""
        async with self._lock(name):
            serving = self.state.chain(name).serving()
            done = await archive()
        await self._let_go(name, serving)
        return done

    async def forget(self, name: str) -> None:
        """Another process archived the scenario (its log left the shared heads): stop serving
        it and forget it here too (the `on_archived` hooks run), so its name starts afresh."""
        async with self._lock(name):
            if name not in self.state.scenarios():
                return  # archived here (`retire`), or never known
            serving = self.state.chain(name).serving()
            self.state.forget(name)
        for hook in self.on_archived:
            await hook(name)
        await self._let_go(name, serving)
        log.info("scenario archived elsewhere", extra={"reef": {"event": "scenario_forgotten", "scenario": name}})

    async def _let_go(self, name: str, serving: ReleaseRef) -> None:
        """Stop an archived scenario's canary; unload what served it once no request pins it."""
        await self.stop_canary(name)
        if serving.runtime_load_id is not None:
            asyncio.get_running_loop().create_task(self._unload_when_free(serving.runtime_load_id))
        self.unreachable.clear(name)

    # -- canaries (reef.serve.canary) ---------------------------------------------------------

    async def start_canary(self, name: str, release_id: str, files: Mapping[str, bytes], fraction: float) -> ReleaseRef:
        """Serve `files` as release `release_id` to `fraction` of the scenario's new requests."""
        await self.stop_canary(name)
        serving = self.state.chain(name).serving()
        content = {**await asyncio.to_thread(self.state.artifacts.files, serving.release_id), **files}  # its harness
        content_id = content_id_of(content)  # what it serves, hashed like any release's content
        load_id = await self.runtime.load(content_id, content)
        self.harness.remember(content_id, content)
        ref = ReleaseRef(release_id, content_id, load_id)
        self.canaries[name] = (ref, fraction)
        return ref

    async def stop_canary(self, name: str) -> None:
        """Admit no more requests to the scenario's canary; unload it once none pins it."""
        canary = self.canaries.pop(name, None)
        if canary is not None and canary[0].runtime_load_id is not None:
            asyncio.get_running_loop().create_task(self._unload_when_free(canary[0].runtime_load_id))

    def _retire(self, previous: ReleaseRef, ref: ReleaseRef) -> None:
        if previous.runtime_load_id and previous.runtime_load_id != ref.runtime_load_id:
            asyncio.get_running_loop().create_task(self._unload_when_free(previous.runtime_load_id))

    async def _unload_when_free(self, runtime_load_id: str) -> None:
        while self.pinned(runtime_load_id):
            await asyncio.sleep(0.05)
        await self.runtime.unload(runtime_load_id)

    async def _ensure_loaded(self, chain: ReleaseChain) -> ReleaseRef:
        ref = chain.serving()
        if ref.runtime_load_id is not None:
            return ref
        # a read that failed within the follower's interval is not tried again per request
        failed = self.unreachable.recent(chain.scenario, ref.release_id, FOLLOW_INTERVAL_S)
        if failed is not None:
            raise _nothing_to_serve(chain.scenario, ref.release_id, failed.reason)
        async with self._lock(chain.scenario):
            return await self._load_serving(chain)

    async def _load_serving(self, chain: ReleaseChain) -> ReleaseRef:
        """With the scenario's lock held: make sure the serving release has a runtime load."""
        ref = chain.serving()
        if ref.runtime_load_id is not None:
            return ref
        try:
            files = await asyncio.to_thread(self.state.artifacts.files, ref.release_id)
        except MissingArtifact as exc:  # a release the log names and this front end cannot read: 503, not 404
            self.unreachable.note(chain.scenario, ref.release_id, None, str(exc))
            raise _nothing_to_serve(chain.scenario, ref.release_id, str(exc)) from exc
        load_id = await self.runtime.load(ref.content_id, files)
        self.harness.remember(ref.content_id, files)
        loaded = ReleaseRef(ref.release_id, ref.content_id, load_id)
        chain.advance(ref.release_id, loaded)
        return loaded

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())


class HeadFollower:
    """Keeps one front end serving the head of every scenario of a shared commit log."""

    def __init__(self, state: ReefState, scenarios: ScenarioDirectory, interval: float = FOLLOW_INTERVAL_S) -> None:
        self.state = state
        self.scenarios = scenarios
        self.interval = interval
        self.seen: dict[str, int] = {}  # scenario -> last step this front end has followed
        self._failing: dict[str, str] = {}  # scenario -> the error last logged for it
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="head-follower")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def run(self) -> None:
        logs = self.state.commit_logs
        watch = logs.watch() if hasattr(logs, "watch") else None
        try:
            while True:
                if watch is not None:
                    await asyncio.to_thread(watch.wait, self.interval)
                else:
                    await asyncio.sleep(self.interval)
                await self.catch_up()
        finally:
            if watch is not None:
                watch.close()

    async def catch_up(self) -> None:
        """Serve the head of every scenario whose last step moved since the last look."""
        try:
            heads: dict[str, int] = await asyncio.to_thread(self.state.commit_logs.heads)  # type: ignore[attr-defined]
        except ReefError as exc:
            self._note("*", f"cannot read the heads: {exc}")
            return
        self._failing.pop("*", None)
        for name, step in heads.items():
            if self.seen.get(name) == step:
                continue
            try:
                first_look = name not in self.seen
                chain = await asyncio.to_thread(self.state.discover, name)
                if chain is None:
                    continue
                ref = await self.scenarios.follow_head(chain)
            except ReleaseUnreachable:  # recorded and logged by the directory; tried again next time
                continue
            except ReefError as exc:  # e.g. the commit log unreachable: tried again next time
                self._note(name, str(exc))
                continue
            self.seen[name] = step
            self._failing.pop(name, None)
            if ref is not None:
                log.info(
                    "following the head",
                    extra={
                        "reef": {"event": "head_followed", "scenario": name, "release_id": ref.release_id, "step": step}
                    },
                )
            if first_look:  # e.g. created by another front end, or found by `ReefState.chain`
                for hook in self.scenarios.on_created:
                    await hook(name)
        await self._forget_archived(heads)

    async def _forget_archived(self, heads: dict[str, int]) -> None:
        """Scenarios this front end serves whose log left the heads: another process archived
        them (reef/commit/archive.py). The heads are read again first: a scenario created here
        after the first read is in the second."""
        for name in [n for n in self.seen if n not in heads]:
            del self.seen[name]  # a new scenario of the name is a first look again
        gone = set(self.state.scenarios()) - set(heads)
        if not gone:
            return
        try:
            again: dict[str, int] = await asyncio.to_thread(self.state.commit_logs.heads)  # type: ignore[attr-defined]
        except ReefError:
            return  # tried again next time
        for name in sorted(gone - set(again)):
            await self.scenarios.forget(name)

    def _note(self, name: str, problem: str) -> None:
        if self._failing.get(name) != problem:  # once per distinct problem, not once a second
            self._failing[name] = problem
            log.warning("cannot follow the head of %s: %s", name, problem)


def _nothing_to_serve(scenario: str, release_id: str, reason: str) -> ReleaseUnreachable:
    return ReleaseUnreachable(
        f"scenario {scenario!r} has no release this front end can serve: it cannot read "
        f"release {release_id} ({reason}); {FIX}"
    )


def _check_request_binding(name: str, binding: dict, recipe: str | None, release_id: str | None) -> None:
    if recipe is not None and recipe != binding["recipe"]:
        raise Conflict(f"scenario {name!r} is bound to recipe {binding['recipe']!r}; x-reef-recipe says {recipe!r}")
    if release_id is not None and release_id != binding["starting_release_id"]:
        raise Conflict(
            f"scenario {name!r} started from release {binding['starting_release_id']!r}; x-reef-release-id says {release_id!r}"
        )
