"""Import circles and layering of the ``instrument`` package, read from the source.

Nothing of the package is imported: every ``instrument/**.py`` is parsed with :mod:`ast` and
each ``import`` of an ``instrument`` module becomes an edge, of one of three kinds:

- ``module``: runs when the importing module is imported (top level, also inside a
  top-level ``if``/``try``/``with`` or a class body);
- ``function``: runs when a function runs (inside ``def``, ``async def`` or ``lambda``);
- ``typing``: never runs (inside ``if TYPE_CHECKING:``).

``import a.b.c`` and ``from a.b import c`` (``c`` a module) are edges to ``a.b.c`` only, not
to the packages ``a`` and ``a.b`` Python also runs: a package ``__init__`` only re-exports.

It fails (exit 1), naming files and lines, on

1. an import circle among ``module`` edges (modules that cannot be imported one at a time);
2. an import circle that needs a ``function`` edge to close (the same circle, hidden in a
   function body: two modules that each need the other);
3. a module's private name used by another module: ``from instrument.x import _name``, or
   ``x._name`` on an imported ``instrument`` module (read, written or called; a private
   *module* such as ``instrument._state`` is the package's, and any module may import it);
4. an import, of any kind, that breaks a layering rule of ``docs/architecture.md``: the
   ``text`` block after the line ``<!-- layering rule -->``, one rule a line::

       core = instrument._state instrument.clocks ...     (a name for a set of modules)
       core never imports instrument.distributed ...      (a rule)

   A module matches a name when it is that module or inside that package.

``python tools/check_imports.py`` prints the imports between modules, the module-level and
the function-level ones apart (``--list``), then every problem; exit 0 when there is none.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "instrument"
KINDS = ("module", "function", "typing")
RULE_MARKER = "<!-- layering rule -->"


@dataclass(frozen=True)
class Import:
    """One import of a package module by another: where it is written and when it runs."""

    source: str
    target: str
    line: int
    kind: str  # "module", "function" or "typing"


@dataclass(frozen=True)
class Rule:
    """``sources`` never import ``targets`` (module names or package prefixes)."""

    text: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]


def module_files(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` of ``package`` under ``root``."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(
    tree: ast.AST, kind: str = "module"
) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement under ``tree`` with the kind of the place it is written in."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, kind
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _statements(node, "typing" if kind == "typing" else "function")
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _statements(ast.Module(body=[child], type_ignores=[]), "typing")
            for child in node.orelse:
                yield from _statements(ast.Module(body=[child], type_ignores=[]), kind)
        else:
            yield from _statements(node, kind)


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name ``from <level dots><name>`` means inside ``module``."""
    if not level:
        return name or ""
    base = module.split(".")
    base = base[: len(base) - level + (1 if is_package else 0)]
    return ".".join([*base, name] if name else base)


def imports_of(module: str, path: Path, modules: Iterable[str]) -> list[Import]:
    """The imports of package modules written in ``path`` (the module ``module``)."""
    known = set(modules)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node, kind in _statements(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.level, node.module)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                targets.append(child if child in known else base)
        for target in targets:
            while target and target not in known:  # ``import a.b.func`` is not a module
                target = target.rpartition(".")[0]
            if target and target != module:
                found.append(Import(module, target, node.lineno, kind))
    return sorted(set(found), key=lambda i: (i.source, i.line, i.target))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(
    module: str, path: Path, modules: Iterable[str], root: Path = ROOT, package: str = PACKAGE
) -> list[str]:
    """``file:line: ...`` for each private name of another package module that ``path``
    (the module ``module``) imports or reaches as an attribute of an imported module."""
    known = set(modules)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    where = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    aliases: dict[str, str] = {}  # local name -> the package module it is bound to
    found = []
    for node, _kind in _statements(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known and alias.asname:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, is_package, node.level, node.module)
            if base != package and not base.startswith(package + "."):
                continue
            for alias in node.names:
                child = f"{base}.{alias.name}"
                if child in known:
                    aliases[alias.asname or alias.name] = child
                elif _private(alias.name) and base != module:
                    found.append(f"{where}:{node.lineno}: imports {base}'s private {alias.name}")
    # names also bound otherwise (arguments, assignments) are not reliably the module
    bound = {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)} | {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    for attribute in ast.walk(tree):
        if not (isinstance(attribute, ast.Attribute) and _private(attribute.attr)):
            continue
        value = attribute.value
        target = None
        if isinstance(value, ast.Name) and value.id in aliases and value.id not in bound:
            target = aliases[value.id]
        elif isinstance(value, ast.Attribute):  # instrument.x._name
            dotted = ast.unparse(value)
            target = dotted if dotted in known else None
        name = attribute.attr
        if target is not None and target != module and f"{target}.{name}" not in known:
            found.append(f"{where}:{attribute.lineno}: uses {target}'s private {name}")
    return found


def all_private_uses(root: Path = ROOT, package: str = PACKAGE) -> list[str]:
    """Every use of another module's private name in ``package`` under ``root``."""
    modules = module_files(root, package)
    return [
        f"private name across modules: {use}"
        for name, path in modules.items()
        for use in private_uses(name, path, modules, root, package)
    ]


def all_imports(root: Path = ROOT, package: str = PACKAGE) -> list[Import]:
    """Every import between modules of ``package`` under ``root``."""
    modules = module_files(root, package)
    return [found for name, path in modules.items() for found in imports_of(name, path, modules)]


def circles(edges: Iterable[Import]) -> list[tuple[frozenset[str], list[Import]]]:
    """Each group of modules that import one another (a strongly connected component,
    Tarjan) with one circle of imports through it, from its smallest module."""
    graph: dict[str, dict[str, Import]] = {}
    for edge in edges:
        graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
        graph.setdefault(edge.target, {})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [(frozenset(group), _circle_through(graph, group)) for group in sorted(groups)]


def _circle_through(graph: dict[str, dict[str, Import]], group: list[str]) -> list[Import]:
    """The shortest circle from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths: dict[str, list[Import]] = {start: []}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt, edge in sorted(graph[node].items()):
                if nxt == start:
                    return [*paths[node], edge]
                if nxt in members and nxt not in paths:
                    paths[nxt] = [*paths[node], edge]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {group}")  # a component always has one


def read_rules(text: str) -> list[Rule]:
    """The layering rules of the ``text`` block after :data:`RULE_MARKER` in ``text``."""
    match = re.search(re.escape(RULE_MARKER) + r"\s*```text\n(.*?)```", text, re.S)
    if match is None:
        raise ValueError(f"no ```text block after {RULE_MARKER!r}")
    names: dict[str, tuple[str, ...]] = {}
    rules = []

    def expand(words: Sequence[str]) -> tuple[str, ...]:
        return tuple(m for w in words for m in names.get(w, (w,)))

    for line in match.group(1).splitlines():
        named = re.fullmatch(r"\s*([\w.]+)\s*=\s*(.+)", line)
        rule = re.fullmatch(r"\s*(.+?)\s+never imports\s+(.+)", line)
        if named:
            names[named[1]] = expand(named[2].split())
        elif rule:
            rules.append(Rule(line.strip(), expand(rule[1].split()), expand(rule[2].split())))
        elif line.strip():
            raise ValueError(f"not a layering rule: {line.strip()!r}")
    if not rules:
        raise ValueError(f"the block after {RULE_MARKER!r} holds no rule")
    return rules


def _within(module: str, names: Iterable[str]) -> bool:
    return any(module == name or module.startswith(name + ".") for name in names)


def broken_rules(edges: Iterable[Import], rules: Iterable[Rule]) -> list[tuple[Rule, Import]]:
    """Each import that a rule forbids, with the rule."""
    return [
        (rule, edge)
        for rule in rules
        for edge in edges
        if _within(edge.source, rule.sources) and _within(edge.target, rule.targets)
    ]


def _where(edge: Import, files: dict[str, Path], root: Path) -> str:
    place = files[edge.source].relative_to(root).as_posix()
    return f"{place}:{edge.line}: {edge.source} -> {edge.target} ({edge.kind}-level)"


def problems(
    root: Path = ROOT, rules_file: Path | None = None, package: str = PACKAGE
) -> list[str]:
    """Every circle and every broken layering rule of ``package`` under ``root``, in words
    (the rules from ``rules_file``, by default ``docs/architecture.md``)."""
    files = module_files(root, package)
    edges = all_imports(root, package)
    rules = read_rules((rules_file or root / "docs" / "architecture.md").read_text("utf-8"))
    found = []
    seen = set()
    runtime = (
        (("module",), "module-level imports"),
        (("module", "function"), "function-level imports"),
    )
    for kinds, what in runtime:
        chosen = [e for e in edges if e.kind in kinds]
        for group, circle in circles(chosen):
            if group in seen:
                continue
            seen.add(group)
            path = " -> ".join([circle[0].source, *(e.target for e in circle)])
            inside = [e for e in chosen if e.source in group and e.target in group]
            found.append(
                f"import circle through {what}: {path}\n"
                f"  the {len(group)} modules import one another here:\n"
                + "\n".join("    " + _where(edge, files, root) for edge in inside)
            )
    for rule in rules:
        for name in (*rule.sources, *rule.targets):
            if not any(_within(module, [name]) for module in files):
                found.append(f"layering rule {rule.text!r} names {name}, which is no module")
    for rule, edge in broken_rules(edges, rules):
        found.append(f"layering rule {rule.text.split()[0]!r} broken: {_where(edge, files, root)}")
    found.extend(all_private_uses(root, package))
    return found


def listing(root: Path = ROOT) -> str:
    """The imports between package modules, one block per kind."""
    edges = all_imports(root)
    out = []
    for kind in KINDS:
        out.append(f"# {kind}-level imports")
        out.extend(f"{e.source} -> {e.target}  (line {e.line})" for e in edges if e.kind == kind)
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout (default: this one)")
    parser.add_argument("--list", action="store_true", help="print every import first")
    args = parser.parse_args(argv)
    if args.list:
        print(listing(args.root))
    found = problems(args.root)
    for problem in found:
        print(problem)
    if found:
        print(f"{len(found)} import problem(s); the rule is in docs/architecture.md")
        return 1
    print("imports: no circle, layering rules kept, no private name used across modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
