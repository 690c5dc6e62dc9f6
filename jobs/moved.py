"""Module paths of jobs/ before the family folders, each importable as the module that replaced it.

Registered models are pickles that name their classes by module path (`jobs.tasks.sna_lorenz.OneStepForecaster`,
`jobs.symbolic_task.PackedSymbolic`), and a model registered before the move may be loaded without the copy of
jobs/ it shipped as MLflow code_paths. `install()` (run by jobs/__init__.py) puts a finder on `sys.meta_path`
that answers an old path with the new module itself, so unpickling finds the very same class. New code imports
the new paths; tests/jobs/test_old_layout_models.py loads models saved by the old layout.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

MOVED: dict[str, str] = {
    "jobs.tasks.tversky_xor": "jobs.tversky.xor",
    "jobs.tasks.tversky_xor_grid": "jobs.tversky.xor_grid",
    "jobs.tasks.tversky_xor_grid_summary": "jobs.tversky.xor_grid_summary",
    "jobs.tasks.tversky_image": "jobs.tversky.image",
    "jobs.tasks.tversky_image_summary": "jobs.tversky.image_summary",
    "jobs.tasks.tversky_lm": "jobs.tversky.lm",
    "jobs.data.xor": "jobs.tversky.xor_data",
    "jobs.data.images": "jobs.tversky.images",
    "jobs.tasks.sna_halfcheetah": "jobs.sna.halfcheetah",
    "jobs.tasks.sna_lorenz": "jobs.sna.lorenz",
    "jobs.tasks.sna_lm": "jobs.sna.lm",
    "jobs.sac": "jobs.sna.sac",
    "jobs.data.lorenz": "jobs.sna.lorenz_system",
    "jobs.tasks.memory_capacity": "jobs.memory.capacity",
    "jobs.tasks.memory_hopfield": "jobs.memory.hopfield",
    "jobs.tasks.memory_neurons": "jobs.memory.neurons",
    "jobs.tasks.memory_neurons_report": "jobs.memory.neurons_report",
    "jobs.memory_metrics": "jobs.memory.capacity_curve",
    "jobs.data.facts": "jobs.memory.facts",
    "jobs.tasks.symbolic_prop": "jobs.symbolic.prop",
    "jobs.tasks.symbolic_ltl": "jobs.symbolic.ltl",
    "jobs.symbolic_task": "jobs.symbolic.task",
    "jobs.symbolic_sets": "jobs.symbolic.sets",
    "jobs.symbolic_eval": "jobs.symbolic.eval",
    "jobs.symbolic_report": "jobs.symbolic.report",
    "jobs.symbolic_loop": "jobs.symbolic.loop",
    "jobs.data.symbolic": "jobs.symbolic.data",
    "jobs.data.propositional": "jobs.symbolic.prop_data",
    "jobs.data.ltl": "jobs.symbolic.ltl_data",
    "jobs.data.checkers": "jobs.symbolic.checkers",
    "jobs.data.symbolic_metrics": "jobs.symbolic.metrics",
    "jobs.gpt_lm": "jobs.lm.gpt_lm",
    "jobs.lm_loop": "jobs.lm.loop",
}
OLD_PACKAGES = ("jobs.tasks",)
"""Old packages with no module of their own left: imported as empty packages so their old submodules resolve."""


class _Alias(importlib.abc.Loader):
    def __init__(self, target: str | None) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self.target is None:
            package = types.ModuleType(spec.name, "An old package of jobs/ (jobs/moved.py).")
            package.__path__ = []
            return package
        return importlib.import_module(self.target)

    def exec_module(self, module: types.ModuleType) -> None:
        """The module is the new one, already executed (or the empty old package)."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in MOVED:
            return importlib.machinery.ModuleSpec(fullname, _Alias(MOVED[fullname]))
        if fullname in OLD_PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, _Alias(None), is_package=True)
        return None


def install() -> None:
    """Add the finder once: after the path finders, so that a module that exists at a path always wins."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
