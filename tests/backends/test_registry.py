"""The registry finds the backends by what their modules declare (``BACKENDS``), read from the
files' text: naming one imports no other, and every declaration names a class of its role."""

import json
import subprocess
import sys

import pytest

from bestofn.backends import registry
from bestofn.backends.base import Backend


def test_every_declared_backend_is_a_class_of_its_role_and_name():
    declared = registry.declared()
    assert {"piper", "moss-fast", "identity", "sidon", "duration", "parakeet"} <= set(declared)
    for name, d in declared.items():
        cls = registry.backend_class(d.role, name)
        assert issubclass(cls, registry.ROLE_BASE[d.role]) and cls.name == name, d
        assert all(isinstance(t, str) and t for t in d.preload), d


def test_finding_the_backends_imports_none_of_them():
    code = (
        "import json, sys; from bestofn.backends import registry; import bestofn.weights.manifest; "
        "registry.check_name('scorer', 'parakeet'); "
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('bestofn.backends.') or "
        "m in ('torch', 'transformers', 'nemo'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["bestofn.backends.base", "bestofn.backends.registry"]


def test_an_unknown_name_lists_the_declared_ones():
    with pytest.raises(registry.UnknownBackend, match="known: .*duration.*volume"):
        registry.check_name("scorer", "nope")
    with pytest.raises(registry.UnknownBackend):
        registry.check_name("scorer", "moss-fast")  # a generator


def test_preload_order_and_parallel_builds_come_from_the_declarations():
    ranked = sorted((n for n in registry.declared() if registry.preload_targets(n)),
                    key=registry.preload_rank)  # fmt: skip
    assert ranked[:4] == ["empathic-insight", "parakeet", "sidon", "voiceclap"]
    assert registry.builds_beside_others("moss-fast") and registry.builds_beside_others("duration")
    assert not registry.builds_beside_others("parakeet")
    assert not registry.builds_beside_others("pkg.mod:Plugin") and not registry.preload_targets(
        "pkg.mod:Plugin"
    )


def test_published_weights_name_a_declared_backend():
    names = [e["name"] for _, e in registry.published_weights()]
    assert len(names) == len(set(names))
    for backend, _ in registry.published_weights():
        assert backend in registry.declared()
    assert issubclass(registry.backend_class("scorer", "wavlm-speaker"), Backend)
