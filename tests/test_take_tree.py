"""One walk per flush: ``take_tree`` (C, and ``registry._take_tree`` in Python) takes every
path's figures into columns, counts idle flushes and releases idle leaves; the C and the
Python walk give the same columns, bit for bit."""

from __future__ import annotations

import random
from array import array
from typing import Any

import pytest

from instrument import registry
from instrument._native import speedups
from instrument.registry import PathNode
from instrument.stats import Accumulator

needs_c = pytest.mark.skipif(speedups is None, reason="C accelerator not built or disabled")
WALKS = [pytest.param(registry._take_tree, id="python")]
if speedups is not None:
    WALKS.append(pytest.param(speedups.take_tree, id="c"))

#: (path, level, durations): a tree with an unrecorded middle node and a skipped branch
SHAPE: list[tuple[str, int, list[int]]] = [
    ("a", 0, [5, 7, 1_000_000]),
    ("a/b", 1, []),
    ("a/b/c", 0, [3]),
    ("a/d", 2, [2**62, 2**62, 2**62]),  # sums beyond 64 bits
    ("e", 0, []),
    ("e/f", 0, []),
    ("g", 3, [0, 8, 9, 1023, 1024, 1025, 2**40]),
]


def _tree() -> tuple[PathNode, dict[str, PathNode]]:
    """A tree outside the registry, with SHAPE's records."""
    root = PathNode("", None)
    nodes: dict[str, PathNode] = {}
    for path, level, durations in SHAPE:
        parent_path, _, name = path.rpartition("/")
        parent = nodes[parent_path] if parent_path else root
        node = nodes[path] = PathNode(name, parent, level)
        parent.children[name] = node
        for d in durations:
            node.add(d)
    return root, nodes


def _columns(taken: Any) -> dict[str, Any]:
    nodes, paths, modes, counts, totals, figures, links, regions, released = taken
    f, lk = array("d"), array("q")
    f.frombytes(figures)
    lk.frombytes(links)
    return {
        "paths": paths,
        "nodes": [n.path for n in nodes],
        "modes": modes,
        "counts": counts,
        "totals": totals,
        "figures": list(f),
        "links": list(lk),
        "regions": regions,
        "released": released,
    }


@pytest.mark.parametrize("take_tree", WALKS)
def test_rows_are_the_recorded_paths_in_tree_order_with_exact_figures(take_tree: Any) -> None:
    root, nodes = _tree()
    got = _columns(take_tree(root, 8, None, None))
    recorded = [(p, lv, d) for p, lv, d in SHAPE if d]
    assert got["paths"] == got["nodes"] == [p for p, _, _ in recorded]
    assert got["counts"] == [len(d) for _, _, d in recorded]
    assert got["totals"] == [sum(d) for _, _, d in recorded]
    assert got["regions"] == sum(len(d) for _, _, d in recorded)
    for i, (_, _, durations) in enumerate(recorded):
        acc = Accumulator()
        acc.add_batch(durations)
        summary = acc.summary()
        assert summary is not None
        assert got["figures"][7 * i : 7 * i + 7] == list(summary[2:])  # bit for bit
    # links: parent row (-1: not a row), own level, highest level on the path
    assert got["links"] == [-1, 0, 0, -1, 0, 1, 0, 2, 2, -1, 3, 3]
    assert all(not n.has_records() for n in nodes.values())
    assert [nodes[p].idle for p, _, _ in SHAPE] == [0, 1, 0, 0, 1, 1, 0]


@pytest.mark.parametrize("take_tree", WALKS)
def test_kept_paths_are_rows_without_records(take_tree: Any) -> None:
    root, nodes = _tree()
    got = _columns(take_tree(root, 8, {nodes["a/b"], nodes["e/f"]}, None))
    assert got["paths"] == ["a", "a/b", "a/b/c", "a/d", "e/f", "g"]
    assert got["counts"][1] == got["totals"][1] == 0
    assert got["figures"][7:14] == [0.0] * 7
    assert got["links"][6:9] == [1, 0, 1]  # a/b/c's parent is now row 1


@needs_c
def test_c_and_python_walks_give_the_same_columns() -> None:
    assert speedups is not None
    rng = random.Random(1)
    for _ in range(20):
        trees = [_tree(), _tree()]
        for path in SHAPE:  # the same extra records in both
            values = [int(rng.lognormvariate(8, 5)) for _ in range(rng.randrange(0, 50))]
            for _, nodes in trees:
                for v in values:
                    nodes[path[0]].add(v)
        keep = {rng.choice(SHAPE)[0]}
        (c_root, c_nodes), (py_root, py_nodes) = trees
        c = _columns(speedups.take_tree(c_root, 8, {c_nodes[p] for p in keep}, None))
        py = _columns(registry._take_tree(py_root, 8, {py_nodes[p] for p in keep}, None))
        assert c == py


@pytest.mark.parametrize("take_tree", WALKS)
def test_only_the_used_buckets_are_cleared_and_nothing_is_left(take_tree: Any) -> None:
    """After a take, the histogram is empty: a later interval's percentiles are its own."""
    root, nodes = _tree()
    node = nodes["g"]
    for v in (1, 10**3, 10**6, 10**9, 10**12):
        node.add(v)
    take_tree(root, 8, None, None)
    node.add(500)
    got = _columns(take_tree(root, 8, None, None))
    assert got["paths"] == ["g"]
    assert got["figures"][4:7] == [500e-9] * 3  # p50, p90, p99: the one call, clamped
    node.add(2)
    node.add(10**12)  # spans the buckets of the first interval: none may be left there
    acc = Accumulator()
    acc.add_batch([2, 10**12])
    summary = acc.summary()
    assert summary is not None
    assert _columns(take_tree(root, 8, None, None))["figures"] == list(summary[2:])


@pytest.mark.parametrize("take_tree", WALKS)
def test_idle_leaves_are_released_unless_held(take_tree: Any) -> None:
    root, nodes = _tree()
    held = nodes["e/f"]  # noqa: F841 - a reference held elsewhere (a hook's cache)
    concurrent = {nodes["g"]}
    del nodes
    released = []
    for _ in range(3):
        released.append(take_tree(root, 2, None, concurrent)[-1])
    # at the third walk every path is idle for 2 (or more) and released, children first
    # (a/b/c, then a/b, then a), but e/f, which a reference holds, and e, its parent
    assert released == [0, 0, 5]
    left = sorted(_all_paths(root))
    assert left == ["e", "e/f"]  # e/f is held, so e keeps a child
    assert concurrent == set()  # a released concurrent path leaves the set


def _all_paths(node: PathNode) -> list[str]:
    out = []
    for child in node.children.values():
        out.append(child.path)
        out.extend(_all_paths(child))
    return out


@pytest.mark.parametrize("take_tree", WALKS)
def test_a_child_that_is_not_a_node_raises_and_takes_nothing(take_tree: Any) -> None:
    root, nodes = _tree()
    nodes["a/b"].children["junk"] = 5  # type: ignore[assignment]
    with pytest.raises(TypeError, match="children must be path nodes, got 5 under the key 'junk'"):
        take_tree(root, 8, None, None)
    assert nodes["a"].has_records()  # nothing taken: the records wait for the next flush


@needs_c
def test_c_take_tree_checks_its_arguments() -> None:
    assert speedups is not None
    root, _ = _tree()
    with pytest.raises(TypeError):
        speedups.take_tree(5, 8, None, None)
    with pytest.raises(TypeError, match="keep must be a set or None"):
        speedups.take_tree(root, 8, [1], None)
    with pytest.raises(TypeError, match="concurrent must be a set or None"):
        speedups.take_tree(root, 8, None, frozenset())
    blank = speedups.NodeBase()
    root.children["blank"] = blank
    with pytest.raises(TypeError, match="without its path"):
        speedups.take_tree(root, 8, None, None)


@pytest.mark.parametrize("take_tree", WALKS)
def test_a_node_among_its_own_children_raises_instead_of_walking_forever(take_tree: Any) -> None:
    root, nodes = _tree()
    nodes["a/b/c"].children["loop"] = nodes["a"]
    with pytest.raises(ValueError, match="deeper than 65536 nodes below 'loop'"):
        take_tree(root, 8, None, None)
    assert nodes["a"].has_records()  # nothing taken
    del nodes["a/b/c"].children["loop"]
    assert _columns(take_tree(root, 8, None, None))["paths"][0] == "a"


@pytest.mark.parametrize("take_tree", WALKS)
def test_a_source_gives_the_figures_of_its_nodes_and_leaves_the_tree_alone(
    take_tree: Any,
) -> None:
    root, nodes = _tree()
    _, others = _tree()
    source = {nodes[path]: others[path] for path in ("a", "a/d", "g")}
    got = _columns(take_tree(root, 8, None, None, source))
    assert got["paths"] == ["a", "a/d", "g"]
    assert not others["a"].has_records()  # taken from the source
    fresh = _columns(take_tree(_tree()[0], 8, None, None))
    rows = [fresh["paths"].index(path) for path in got["paths"]]
    assert got["counts"] == [fresh["counts"][row] for row in rows]
    assert got["totals"] == [fresh["totals"][row] for row in rows]
    assert got["figures"] == [x for row in rows for x in fresh["figures"][7 * row : 7 * row + 7]]
    assert nodes["a/b/c"].has_records()  # not in the source: its own records stay
    assert nodes["a"].has_records()


@pytest.mark.parametrize(
    "node_type", [registry._PyNodeBase, *([] if speedups is None else [speedups.NodeBase])]
)
def test_drain_into_adds_whole_records_to_every_reader_and_resets(node_type: Any) -> None:
    values = [0, 7, 1023, 1024, 2**40, 2**62, 2**62]
    node, readers = node_type(), [node_type(), node_type()]
    readers[1].add(5)
    for value in values:
        node.add(value)
    assert node.drain_into(readers) == (len(values), sum(values))
    assert not node.has_records()
    assert node.drain_into(readers) is None
    alone, with_five = Accumulator(), Accumulator()
    alone.add_batch(values)
    with_five.add_batch([5, *values])
    assert readers[0].take() == alone.summary()
    assert readers[1].take() == with_five.summary()
    with pytest.raises(TypeError, match="another path node"):
        node.drain_into([node])
    with pytest.raises(TypeError, match="list or tuple"):
        node.drain_into({node_type()})
