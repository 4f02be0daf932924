"""The cgroup folders llmgym shares on a machine survive the other llmgym processes there (two runs, a second
test suite, sandboxed scoring at once is normal use): each probes in a trial cgroup of its own, so one
process's clean-up never removes what another is about to join; and a sandbox test that skips names what is
really missing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import sandbox_missing_reason

from llmgym.sandbox import cgroups

# another llmgym process probing (and cleaning up after its probes) on the same machine
OTHER_PROCESS = """
from llmgym.sandbox.cgroups import call_cgroup_probe, cgroup_probe
print(cgroup_probe()[1] or "ok", call_cgroup_probe()[1] or "ok")
"""


def test_a_cgroup_probe_survives_another_process_probing_and_cleaning_up_meanwhile(monkeypatch):
    """Between this probe's making its trial cgroup and joining it, another process probes to the end (and
    removes its trial cgroup): this probe still joins its own. (A shared trial folder was removed under it:
    "cannot join a cgroup (.../llmgym-sandbox/probe/cgroup.procs: Directory nonexistent)".)"""
    dirs, why = cgroups.cgroup_probe()
    if dirs is None:
        pytest.skip(f"no writable cgroup tree here: {why}")
    real_prepare = cgroups.Cgroups.prepare
    others = []

    def prepare_then_another_process_probes(self, slot, limits):
        procs = real_prepare(self, slot, limits)
        others.append(subprocess.run([sys.executable, "-c", OTHER_PROCESS], capture_output=True, text=True,
                                     timeout=120, check=False))
        return procs

    monkeypatch.setattr(cgroups.Cgroups, "prepare", prepare_then_another_process_probes)
    assert cgroups.cgroup_probe() == (dirs, "")
    assert len(others) == 1 and others[0].returncode == 0, others[0].stderr[-500:]
    assert others[0].stdout.split()[0] == "ok"


def test_a_skip_names_the_missing_mechanism_and_why_and_advises_the_install_script_only_where_it_helps():
    info = {"missing": ["cgroup"], "why": {"cgroup": "cannot join a cgroup: permission denied"}}
    reason = sandbox_missing_reason(info)
    assert "cgroup: cannot join a cgroup: permission denied" in reason and "install-sandbox" not in reason
    info = {"missing": ["bwrap", "cgroup"], "why": {"bwrap": "bwrap not found on PATH", "cgroup": "needs root"}}
    reason = sandbox_missing_reason(info)
    assert "bwrap: bwrap not found on PATH" in reason and "cgroup: needs root" in reason
    assert "install-sandbox.sh" in reason
