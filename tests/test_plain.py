"""``healthcheck.plain``: the facts' data classes behave as the dataclasses they replace."""
from __future__ import annotations

import pickle
from typing import Any, Dict, List, Optional

import pytest

from healthcheck.facts import GpuFacts, KernelLogFacts, NvmlFacts
from healthcheck.plain import asdict, field, plain, replace


@plain
class Point:
    x: int
    y: int = 0
    tags: List[str] = field(default_factory=list)
    note: Optional[str] = field(default=None, repr=False, compare=False)


def test_arguments_defaults_and_fresh_factories():
    a, b = Point(1), Point(x=2, y=3, tags=["t"])
    assert (a.x, a.y, a.tags, a.note) == (1, 0, [], None) and (b.x, b.y, b.tags) == (2, 3, ["t"])
    a.tags.append("mine")
    assert Point(1).tags == []                        # a fresh list per instance
    with pytest.raises(TypeError, match="missing required argument: 'x'"):
        Point()
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        Point(1, z=2)
    with pytest.raises(TypeError, match="multiple values"):
        Point(1, x=2)


def test_equality_repr_and_hash_follow_dataclass():
    assert Point(1, note="a") == Point(1, note="b")   # compare=False
    assert Point(1) != Point(2) and Point(1) != (1, 0)
    assert repr(Point(1, 2, ["t"], "hidden")) == "Point(x=1, y=2, tags=['t'])"
    with pytest.raises(TypeError):
        hash(Point(1))


def test_a_required_field_after_a_default_is_refused():
    with pytest.raises(TypeError, match="without a default follows"):
        @plain
        class Bad:
            a: int = 0
            b: int


def test_facts_pickle_across_the_probe_child_and_turn_into_dicts():
    facts = NvmlFacts(device_count=1, gpus=[GpuFacts(0, uuid="GPU-1", ecc={"volatile_uncorrected": 0})])
    again = pickle.loads(pickle.dumps(facts))
    assert again == facts and again.gpus[0].subject() == "GPU 0"
    out: Dict[str, Any] = asdict(facts)
    assert out["gpus"][0]["uuid"] == "GPU-1" and out["gpus"][0]["ecc"] == {"volatile_uncorrected": 0}
    assert out["status"] == "ok" and isinstance(out["gpus"][0], dict)
    assert "read=" not in repr(KernelLogFacts(read=object()))


@plain(frozen=True)
class Key:
    name: str
    size: int = 1


def test_frozen_ones_refuse_assignment_and_hash_on_their_fields():
    key = Key("a")
    with pytest.raises(AttributeError):
        key.size = 2
    assert {Key("a"): 1}[Key("a", 1)] == 1 and Key("a") != Key("a", 2)
    assert pickle.loads(pickle.dumps(key)) == key


def test_replace_makes_a_changed_copy():
    key = Key("a", 3)
    assert replace(key, size=4) == Key("a", 4) and key.size == 3
    with pytest.raises(TypeError):
        replace(key, colour="red")


def test_replace_takes_a_dataclass_too():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Old:
        a: int

    assert replace(Old(1), a=2) == Old(2)


def test_a_drain_reason_gains_keys_through_the_remediation_plan():
    from healthcheck.drain_reason import parse_reason
    from healthcheck.remediate.plan import reason_with

    reason = parse_reason("gpu-hooks: v1 gpu.lost gpu2; GPU 2 is lost", "gpu-hooks:")
    changed = reason_with(reason, {"next": "reboot"})
    assert changed.keys.get("next") == "reboot" and changed.summary == reason.summary
