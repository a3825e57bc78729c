"""A small Python client for Reef's own routes (the CLI uses it; so can your scripts).

    from reef.client import ReefClient
    reef = ReefClient("http://127.0.0.1:8900", token="...")
    reef.report(receipt, score=1.0, feedback="exactly right")

Inference goes through the official OpenAI or Anthropic SDKs pointed at Reef's base URL.
Errors come back as `ReefClientError` with the HTTP status and the server's message.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import httpx

DEFAULT_URL = "http://127.0.0.1:8900"


class ReefClientError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class ReefClient:
    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0) -> None:
        self.url = (url or os.environ.get("REEF_URL") or DEFAULT_URL).rstrip("/")
        token = token or os.environ.get("REEF_TOKEN")
        headers = {"authorization": f"Bearer {token.split(',')[0].strip()}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ReefClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def report(
        self,
        *references: str,
        score: float,
        feedback: str | dict | None = None,
        session: str | None = None,
        scenario: str | None = None,
        metadata: dict | None = None,
        report_id: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"score": score}
        if session:
            body["session"] = session
        else:
            body["references"] = list(references)
        for key, value in (("feedback", feedback), ("metadata", metadata), ("report_id", report_id)):
            if value is not None:
                body[key] = value
        headers = {"x-reef-scenario": scenario} if scenario else {}
        return self._call("POST", "/reef/report", json=body, headers=headers)

    def import_records(self, items: list[dict[str, Any]], scenario: str | None = None) -> dict[str, Any]:
        """Store records served elsewhere, all or none (`POST /reef/records/batch`, docs/http.md)."""
        headers = {"x-reef-scenario": scenario} if scenario else {}
        return self._call("POST", "/reef/records/batch", json={"records": items}, headers=headers)

    def record(self, record_id: str) -> dict[str, Any]:
        return self._call("GET", f"/reef/records/{record_id}")

    def scenarios(self) -> list[dict[str, Any]]:
        return self._call("GET", "/reef/scenarios")["scenarios"]

    def scenario(self, name: str) -> dict[str, Any]:
        return self._call("GET", f"/reef/scenarios/{name}")

    def create_scenario(self, name: str, recipe: str | None = None, release_id: str | None = None) -> dict[str, Any]:
        body = {k: v for k, v in {"name": name, "recipe": recipe, "release_id": release_id}.items() if v is not None}
        return self._call("POST", "/reef/scenarios", json=body)

    def releases(self, scenario: str) -> dict[str, Any]:
        return self._call("GET", f"/reef/scenarios/{scenario}/releases")

    def rollback(self, scenario: str, release_id: str, expected_head: str | None = None) -> dict[str, Any]:
        body = {"release_id": release_id, **({"expected_head": expected_head} if expected_head else {})}
        return self._call("POST", f"/reef/scenarios/{scenario}/rollback", json=body)

    def harness(self, scenario: str | None = None, release_id: str | None = None) -> dict[str, Any]:
        """A scenario's harness (default: the serving release): files, skills, rendered system prompt."""
        params = {k: v for k, v in {"scenario": scenario, "release_id": release_id}.items() if v is not None}
        return self._call("GET", "/reef/harness", params=params)

    def diff(self, scenario: str, release_id: str) -> dict[str, Any]:
        """What a release changed against its parent: `changed` paths and a unified `diff`."""
        return self._call("GET", f"/reef/scenarios/{scenario}/releases/{release_id}/diff")

    def promote(self, scenario: str, release_id: str, expected_head: str | None = None) -> dict[str, Any]:
        """Publish and serve a release the gate held for review."""
        body = {"release_id": release_id, **({"expected_head": expected_head} if expected_head else {})}
        return self._call("POST", f"/reef/scenarios/{scenario}/promote", json=body)

    def train(
        self, scenario: str, instruction: str, references: Sequence[str] = (), instruction_id: str | None = None
    ) -> dict[str, Any]:
        """Give a scenario an instruction to learn from (`POST /reef/train`); its receipt is `instruction_id`."""
        headers = {"x-reef-agent-record-id": instruction_id} if instruction_id else {}
        body = {"scenario": scenario, "instruction": instruction, "references": list(references)}
        return self._call("POST", "/reef/train", json=body, headers=headers)

    def training(self, instruction_id: str) -> dict[str, Any]:
        """Where an instruction stands: queued, candidate, judged, published or rejected."""
        return self._call("GET", f"/reef/train/{instruction_id}")

    def train_now(self, scenario: str) -> dict[str, Any]:
        return self._call("POST", f"/reef/scenarios/{scenario}/train-now", json={})

    def set_training_mode(self, scenario: str, mode: str) -> dict[str, Any]:
        return self._call("POST", f"/reef/scenarios/{scenario}/update", json={"training_mode": mode})

    def config(self, scenario: str) -> dict[str, Any]:
        """The scenario's effective settings; `revision` is what `set_config` names."""
        return self._call("GET", f"/reef/scenarios/{scenario}/config")

    def set_config(self, scenario: str, changes: dict[str, Any], revision: int | None) -> dict[str, Any]:
        """Change live settings if they are still at `revision` (None: whatever they are now)."""
        headers = {"if-match": "*" if revision is None else f'"{revision}"'}
        return self._call("POST", f"/reef/scenarios/{scenario}/config", json=changes, headers=headers)

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/reef/status")

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ReefClientError(0, f"cannot reach Reef at {self.url}: {exc}") from None
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text
            raise ReefClientError(response.status_code, message)
        return response.json()
