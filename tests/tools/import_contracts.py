"""An import-linter contract type the library does not ship: no import cycle among modules.

import-linter's `acyclic_siblings` compares packages level by level; this one looks at modules,
each package's `__init__` included, and at every import statement (those inside functions too,
as grimp reads them). Each strongly connected component of the module graph with more than one
module is a cycle; the report names its modules and the imports (with line numbers) that close it.
Used by the `no-cycles` contract in `.importlinter` (`lint-imports`, run by `make test`).
"""
from __future__ import annotations

import grimp
from importlinter.application import output
from importlinter.domain.contract import Contract, ContractCheck


def module_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The graph's cycles: its strongly connected components of two or more modules (Tarjan)."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(edges[root]))]   # iterative: deep packages would exhaust recursion
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in edges:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return sorted(cycles)


class NoModuleCyclesContract(Contract):
    """No module of the root packages imports itself through others (counting every import)."""

    type_name = "no_module_cycles"

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        cycles = []
        for component in module_cycles(graph):
            members = set(component)
            links = []
            for importer in component:
                for imported in sorted(graph.find_modules_directly_imported_by(importer) & members):
                    lines = [d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)]
                    links.append(f"{importer} -> {imported} (l. {', '.join(map(str, lines))})")
            cycles.append({"modules": component, "links": links})
        return ContractCheck(kept=not cycles, metadata={"cycles": cycles})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for cycle in check.metadata["cycles"]:
            output.print_error(f"A cycle of {len(cycle['modules'])} modules:", bold=True)
            for link in cycle["links"]:
                output.indent_cursor()
                output.print_error(link)
            output.new_line()
