"""PolicyPool on members that say who they are: least outstanding calls, every adapter on every
member, a dead member taken out with its calls retried elsewhere, a bad adapter undone."""

import threading
from pathlib import Path

import pytest

from forge_bridge.core.errors import (
    AdapterError,
    PolicyResponseError,
    PolicyUnavailable,
    Unsupported,
    WrongType,
)
from forge_bridge.core.types import Action
from forge_bridge.policies.base import Policy, PolicyOutput
from forge_bridge.policies.pool import PolicyPool


class Member(Policy):
    """Answers with its name and the adapter it was asked for; can be made to fail or block."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name, self.loaded, self.unloaded = name, [], []
        self.down = self.bad_reply = self.refuse = False
        self.gate: threading.Event | None = None

    def generate(self, messages, tools, sampling, adapter):
        if self.gate is not None:
            self.gate.wait(5)
        if self.down:
            raise PolicyUnavailable(f"{self.name} is down")
        if self.bad_reply:
            raise PolicyResponseError(f"{self.name}: prompt too long")
        return PolicyOutput(Action(content=f"{self.name}:{adapter}"), [1], [2], [-0.1], adapter)

    def load_version(self, path, version):
        if self.refuse:
            raise AdapterError(f"{self.name} refuses {version}")
        if self.down:
            raise PolicyUnavailable(f"{self.name} is down")
        self.loaded.append(version)

    def unload_version(self, version):
        self.unloaded.append(version)


@pytest.fixture
def adapter(adapter_dirs) -> Path:
    return adapter_dirs["v1"]


def test_calls_go_to_the_member_with_fewest_in_flight_and_ties_take_turns():
    a, b, c = Member("a"), Member("b"), Member("c")
    pool = PolicyPool([a, b, c])
    assert [pool.chat([]).text for _ in range(6)] == ["a:None", "b:None", "c:None"] * 2
    a.gate = threading.Event()  # a call stuck on a: the next ones avoid it
    stuck = threading.Thread(target=pool.chat, args=([],))
    stuck.start()
    while pool._outstanding[0] == 0:
        pass
    assert {pool.chat([]).text for _ in range(4)} == {"b:None", "c:None"}
    a.gate.set()
    stuck.join()
    assert pool.served == [3, 4, 4]


def test_every_member_gets_each_adapter_and_each_step_names_it(adapter):
    a, b = Member("a"), Member("b")
    pool = PolicyPool([a, b])
    pool.load_adapter(adapter, "run-v1")
    assert a.loaded == b.loaded == ["run-v1"]
    assert sorted(pool.chat([]).text for _ in range(2)) == ["a:run-v1", "b:run-v1"]
    pool.rollback()
    assert {pool.chat([]).version for _ in range(2)} == {None}


def test_a_dead_member_is_taken_out_and_its_call_is_served_by_another(adapter):
    a, b = Member("a"), Member("b")
    pool = PolicyPool([a, b])
    a.down = True
    assert [pool.chat([]).text for _ in range(3)] == ["b:None"] * 3
    assert list(pool.out) == [0] and "a is down" in pool.out[0]
    pool.load_adapter(adapter, "run-v1")  # out of the pool: not asked to load
    assert a.loaded == [] and b.loaded == ["run-v1"]
    b.down = True
    with pytest.raises(PolicyUnavailable, match="no policy server left"):
        pool.chat([])


def test_a_bad_answer_is_the_calls_error_not_the_servers():
    a, b = Member("a"), Member("b")
    pool = PolicyPool([a, b])
    a.bad_reply = True
    with pytest.raises(PolicyResponseError, match="too long"):
        pool.chat([])
    assert pool.out == {} and pool.chat([]).text == "b:None"


def test_an_adapter_one_member_refuses_is_unloaded_from_the_others_and_nothing_changes(adapter):
    a, b = Member("a"), Member("b")
    pool = PolicyPool([a, b])
    b.refuse = True
    with pytest.raises(AdapterError, match="refuses"):
        pool.load_adapter(adapter, "run-v1")
    assert a.loaded == ["run-v1"] and a.unloaded == ["run-v1"]
    assert pool.current() is None and {pool.chat([]).version for _ in range(2)} == {None}


def test_a_copy_for_a_worker_mirrors_versions_and_members_out(adapter):
    pool = PolicyPool([Member("a"), Member("b")])
    with pytest.raises(Unsupported, match="RayPolicy"):  # members living in this process have no client
        pool.client_spec()
    copy = PolicyPool([Member("a"), Member("b")])
    pool.load_adapter(adapter, "run-v1")
    pool.take_out(0, "maintenance")
    copy.mirror(pool.serving_state())
    assert copy.current() == "run-v1" and copy.out == {0: "maintenance"}
    assert copy.chat([]).text == "b:run-v1"  # served the same version, by the member still in


def test_bad_members_are_clear_errors():
    with pytest.raises(Exception, match="at least one"):
        PolicyPool([])
    with pytest.raises(WrongType):
        PolicyPool([object()])
