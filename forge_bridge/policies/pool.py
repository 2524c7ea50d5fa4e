"""Several policy servers behind one policy: calls spread over them, adapters reach all of them.

Each call goes to the member with the fewest calls in flight (ties in turn), with the adapter
version the pool's own slot names, so the version recorded per step is exact whichever member
served it. `load_adapter` loads the new version into every member before any call may use it.
A member that is unreachable (`PolicyUnavailable`) is taken out of the pool with why: the call
is retried on another, and when none is left the call fails as an outage (the episode records
it as such). A member's bad answer (`PolicyResponseError`) is the call's own error, not the
server's: it is raised as is.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Sequence

from forge_bridge.core.errors import AdapterError, InvalidArgument, PolicyUnavailable, WrongType
from forge_bridge.policies.base import ClientSpec, Policy, PolicyOutput, Sampling


def _connect_pool(specs: list[ClientSpec], keep_versions: int) -> "PolicyPool":
    return PolicyPool([spec.connect() for spec in specs], keep_versions=keep_versions)


class PolicyPool(Policy):
    """N policies serving the same base model (vLLM servers by URL, Ray-hosted policies, or an
    embedded one), used as one."""

    def __init__(self, members: Sequence[Policy], *, keep_versions: int = 3,
                 adapter_roots: Sequence[str | Path] | None = None) -> None:
        super().__init__(keep_versions=keep_versions, adapter_roots=adapter_roots)
        members = list(members)
        if not members:
            raise InvalidArgument("PolicyPool: expected at least one member policy")
        for m in members:
            if not isinstance(m, Policy) or isinstance(m, PolicyPool):
                raise WrongType(f"PolicyPool members: expected forge_bridge policies (not pools), "
                                f"got {type(m).__name__}")
        self.members = members
        self._lock = threading.Lock()
        self._outstanding = [0] * len(members)
        self._served = [0] * len(members)
        self._out: dict[int, str] = {}  # member index -> why it was taken out
        self._turn = 0

    # ------------------------------------------------------------------ what a person looks at
    @property
    def served(self) -> list[int]:
        """Calls each member has answered."""
        with self._lock:
            return list(self._served)

    @property
    def out(self) -> dict[int, str]:
        """Members taken out of the pool, with why."""
        with self._lock:
            return dict(self._out)

    # ------------------------------------------------------------------ choosing a member
    def _pick(self, tried: set[int]) -> int:
        with self._lock:
            live = [i for i in range(len(self.members)) if i not in self._out and i not in tried]
            if not live:
                why = "; ".join(f"member {i}: {w}" for i, w in sorted(self._out.items()))
                raise PolicyUnavailable(f"no policy server left in the pool ({why or 'every member failed this call'})")
            fewest = min(self._outstanding[i] for i in live)
            ties = [i for i in live if self._outstanding[i] == fewest]
            index = ties[self._turn % len(ties)]
            self._turn += 1
            self._outstanding[index] += 1
            return index

    def _done(self, index: int, exc: BaseException | None) -> None:
        with self._lock:
            self._outstanding[index] -= 1
            if exc is None:
                self._served[index] += 1
            elif isinstance(exc, PolicyUnavailable):
                self._out.setdefault(index, str(exc)[:300])

    def take_out(self, index: int, why: str) -> None:
        """Stop sending calls to member `index` (it stays out until `put_back`)."""
        with self._lock:
            self._out[index] = why

    def put_back(self, index: int) -> None:
        """Send calls to member `index` again: it must already hold every version the pool serves."""
        with self._lock:
            self._out.pop(index, None)

    def generate(self, messages, tools, sampling: Sampling, adapter: str | None) -> PolicyOutput:
        tried: set[int] = set()
        while True:
            index = self._pick(tried)
            try:
                out = self.members[index].generate(messages, tools, sampling, adapter)
            except PolicyUnavailable as exc:
                self._done(index, exc)
                tried.add(index)
                continue
            except BaseException as exc:
                self._done(index, exc)
                raise
            self._done(index, None)
            out.info["pool_member"] = index
            return out

    async def agenerate(self, messages, tools, sampling: Sampling, adapter: str | None) -> PolicyOutput:
        tried: set[int] = set()
        while True:
            index = self._pick(tried)
            try:
                out = await self.members[index].agenerate(messages, tools, sampling, adapter)
            except PolicyUnavailable as exc:
                self._done(index, exc)
                tried.add(index)
                continue
            except BaseException as exc:
                self._done(index, exc)
                raise
            self._done(index, None)
            out.info["pool_member"] = index
            return out

    # ------------------------------------------------------------------ adapters on every member
    def load_version(self, path: Path, version: str) -> None:
        loaded: list[int] = []
        for index, member in enumerate(self.members):
            if index in self.out:
                continue
            try:
                member.load_version(path, version)
            except PolicyUnavailable as exc:  # the server is gone: out of the pool, not an error
                self.take_out(index, f"unreachable while loading {version}: {exc}")
                continue
            except BaseException:  # a bad adapter: undo, so no member serves a half-published version
                for done in loaded:
                    try:
                        self.members[done].unload_version(version)
                    except Exception:
                        pass
                raise
            loaded.append(index)
        if not loaded:
            raise AdapterError(f"adapter {version}: no policy server in the pool could load it ({self.out})")

    def unload_version(self, version: str) -> None:
        for index, member in enumerate(self.members):
            if index in self.out:
                continue
            try:
                member.unload_version(version)
            except PolicyUnavailable as exc:
                self.take_out(index, f"unreachable while unloading {version}: {exc}")
            except Exception:  # best effort, as eviction is: the version is no longer served
                pass

    # ------------------------------------------------------------------ clients in other processes
    def client_spec(self) -> ClientSpec:
        return ClientSpec(_connect_pool, ([m.client_spec() for m in self.members], self.keep_versions))

    def serving_state(self) -> dict:
        return {**super().serving_state(), "members": [m.serving_state() for m in self.members],
                "out": self.out}

    def mirror(self, state: dict) -> None:
        super().mirror(state)
        for member, member_state in zip(self.members, state.get("members", [])):
            member.mirror(member_state)
        with self._lock:  # a worker's pool skips what the trainer's has taken out, as of now
            self._out = {int(i): why for i, why in state.get("out", {}).items()}

    def close(self) -> None:
        for member in self.members:
            member.close()


__all__ = ["PolicyPool"]
