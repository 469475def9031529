"""No import cycle anywhere in ``shuffled/`` (the layer contracts in pyproject.toml check
direction between packages; this checks every pair of modules, inside packages too)."""

from __future__ import annotations

import grimp


def test_no_module_of_shuffled_imports_itself_back() -> None:
    graph = grimp.build_graph("shuffled")
    cycles = []
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported.startswith("shuffled") and graph.chain_exists(
                    importer=imported, imported=module):
                chain = graph.find_shortest_chain(importer=imported, imported=module)
                cycles.append(f"{module} -> {' -> '.join(chain or ())}")
    assert not cycles, "import cycles:\n" + "\n".join(cycles)
