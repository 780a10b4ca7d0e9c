"""Allocation discovery: the documented host-list formats of Slurm, PBS, Grid Engine and LSF,
and the allocation found from each scheduler's environment."""

import os
import socket
from pathlib import Path

import pytest

from psij._record import replace
from psij.executors._gpu_detect import NVIDIA, GpuSet
from psij.executors.pilot import allocation
from psij.executors.pilot.allocation import (
    MPIRUN_AGENT_LAUNCHER,
    SRUN_AGENT_LAUNCHER,
    SSH_AGENT_LAUNCHER,
    Allocation,
    allocation_from_options,
    configured_allocation,
    discover_allocation,
    local_allocation,
    nodes_from_spec,
    parse_host_slots_file,
    parse_lsb_mcpu_hosts,
    parse_pe_hostfile,
    parse_slurm_counts,
    parse_slurm_nodelist,
)
from psij.executors.pilot.resources import NodeSpec


@pytest.mark.parametrize("text,hosts", [
    ("vm", ["vm"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
    ("node[8-11]", ["node8", "node9", "node10", "node11"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("gpu[009-010],cpu1", ["gpu009", "gpu010", "cpu1"]),
])
def test_slurm_host_lists_expand_with_padding_kept(text: str, hosts: list) -> None:
    assert parse_slurm_nodelist(text) == hosts


@pytest.mark.parametrize("text,error", [
    ("node[3-1]", "the range '3-1' in 'node\\[3-1\\]' goes backwards"),
    ("node[01-", "unbalanced '\\['"),
    ("node]", "unbalanced '\\]'"),
    ("n[a]", "'a' in 'n\\[a\\]' is not a number or a range"),
    ("", "no host"),
])
def test_bad_slurm_host_lists_are_refused_naming_the_variable(text: str, error: str) -> None:
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST: " + error):
        parse_slurm_nodelist(text)


def test_slurm_count_lists_expand_repeats() -> None:
    assert parse_slurm_counts("4(x2),2") == [4, 4, 2]
    assert parse_slurm_counts("36") == [36]
    assert parse_slurm_counts("1(x3)") == [1, 1, 1]
    with pytest.raises(ValueError, match=r"SLURM_JOB_CPUS_PER_NODE: '4\(x\)'"):
        parse_slurm_counts("4(x),2")


def test_host_per_slot_files_count_lines_in_order_of_first_appearance() -> None:
    text = "n2\nn2\nn1\n\nn2\nn1\n"
    assert parse_host_slots_file(text, "PBS_NODEFILE") == [("n2", 3), ("n1", 2)]
    with pytest.raises(ValueError, match="PBS_NODEFILE: the host file names no host"):
        parse_host_slots_file("\n", "PBS_NODEFILE")


def test_grid_engine_pe_hostfile_sums_the_slots_of_a_host_in_several_queues() -> None:
    text = ("n1.cluster 4 all.q@n1.cluster UNDEFINED\n"
            "n2.cluster 2 all.q@n2.cluster UNDEFINED\n"
            "n1.cluster 1 long.q@n1.cluster UNDEFINED\n")
    assert parse_pe_hostfile(text) == [("n1.cluster", 5), ("n2.cluster", 2)]
    with pytest.raises(ValueError, match="PE_HOSTFILE: line 1 is not 'host slots queue range'"):
        parse_pe_hostfile("n1 four all.q UNDEFINED\n")


def test_lsf_mcpu_hosts_are_host_count_pairs() -> None:
    assert parse_lsb_mcpu_hosts("hostA 4 hostB 2") == [("hostA", 4), ("hostB", 2)]
    with pytest.raises(ValueError, match="LSB_MCPU_HOSTS: expected 'host count' pairs"):
        parse_lsb_mcpu_hosts("hostA 4 hostB")
    with pytest.raises(ValueError, match="LSB_MCPU_HOSTS: 'x' after 'hostA'"):
        parse_lsb_mcpu_hosts("hostA x")


def test_node_specs_from_the_command_line() -> None:
    assert nodes_from_spec("vnode1:1,vnode2:2") == [NodeSpec("vnode1", 1), NodeSpec("vnode2", 2)]
    assert nodes_from_spec("n[1-3]:4") == [NodeSpec(f"n{i}", 4) for i in (1, 2, 3)]
    assert nodes_from_spec("solo") == [NodeSpec("solo", 1)]
    with pytest.raises(ValueError, match="nodes: 'a:x' is not NAME or NAME:CORES"):
        nodes_from_spec("a:x")
    with pytest.raises(ValueError, match="nodes: 'a:0' gives a node no core"):
        nodes_from_spec("a:0")


def test_no_allocation_means_this_machine_with_its_usable_cores_and_memory() -> None:
    found = discover_allocation({})
    (node,) = found.nodes
    assert found.kind == "local" and found.local_node == node.name == socket.gethostname()
    assert node.cores == len(os.sched_getaffinity(0))
    assert node.memory == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert found.remote_nodes == ()
    assert discover_allocation({}, cores=7).nodes[0].cores == 7
    assert local_allocation(3).nodes[0].cores == 3


def test_slurm_allocation_from_its_variables() -> None:
    env = {"SLURM_JOB_NODELIST": "node[01-03]", "SLURM_JOB_CPUS_PER_NODE": "4(x2),2",
           "SLURM_MEM_PER_NODE": "1024", "SLURMD_NODENAME": "node02"}
    found = discover_allocation(env)
    assert found.kind == "slurm"
    assert [(n.name, n.cores, n.memory) for n in found.nodes] == [
        ("node01", 4, 1 << 30), ("node02", 4, 1 << 30), ("node03", 2, 1 << 30)]
    assert found.local_node == "node02"
    assert found.remote_nodes == ("node01", "node03")
    assert found.agent_launcher == SRUN_AGENT_LAUNCHER
    per_cpu = discover_allocation({"SLURM_NODELIST": "a,b", "SLURM_JOB_CPUS_PER_NODE": "2,1",
                                   "SLURM_MEM_PER_CPU": "100"})
    assert [n.memory for n in per_cpu.nodes] == [200 << 20, 100 << 20]
    with pytest.raises(ValueError, match="gives 1 counts for the 3 nodes"):
        discover_allocation({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_CPUS_PER_NODE": "4"})


def test_the_local_node_is_found_by_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocation, "host_name", lambda: "node03.cluster.example")
    found = discover_allocation({"SLURM_JOB_NODELIST": "node[01-03]",
                                 "SLURM_JOB_CPUS_PER_NODE": "1(x3)"})
    assert found.local_node == "node03"
    elsewhere = discover_allocation({"SLURM_JOB_NODELIST": "x1",
                                     "SLURM_JOB_CPUS_PER_NODE": "1"})
    assert elsewhere.local_node is None and elsewhere.remote_nodes == ("x1",)


def test_the_host_name_is_the_one_sockets_report() -> None:
    assert allocation.host_name() == socket.gethostname()


def test_cores_and_nodes_options_describe_one_allocation(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # Neither option: the batch allocation this runs in, else this machine.
    # The local node's GPUs are those found: none in these environments, whatever the
    # machine has.
    slurm = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_CPUS_PER_NODE": "4(x2)",
             "SLURMD_NODENAME": "n1", "CUDA_VISIBLE_DEVICES": ""}
    no_gpus = GpuSet((), NVIDIA, "CUDA_VISIBLE_DEVICES")
    assert allocation_from_options(None, None, slurm) \
        == replace(discover_allocation(slurm), local_gpus=no_gpus)
    assert allocation_from_options(3, None, {"CUDA_VISIBLE_DEVICES": ""}) \
        == replace(local_allocation(3), local_gpus=no_gpus)
    # --nodes outside a batch allocation: every node through an agent on this machine.
    virtual = allocation_from_options(None, "vn[1-2]:2", {})
    assert [(n.name, n.cores) for n in virtual.nodes] == [("vn1", 2), ("vn2", 2)]
    assert virtual.kind == "config" and virtual.local_node is None
    assert virtual.agent_launcher == () and virtual.remote_nodes == ("vn1", "vn2")
    # Inside one: the node this runs on is used directly, the others through its launcher.
    inside = allocation_from_options(None, "n1:1,n2:2", slurm)
    assert inside.local_node == "n1" and inside.remote_nodes == ("n2",)
    assert inside.agent_launcher == SRUN_AGENT_LAUNCHER
    monkeypatch.setattr(allocation, "host_name", lambda: "vn2")
    assert allocation_from_options(None, "vn1,vn2", {}).local_node == "vn2"
    with pytest.raises(ValueError, match="nodes"):
        allocation_from_options(None, "vn1:x", {})


def test_pbs_grid_engine_and_lsf_allocations_from_their_host_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)  # no mpirun: agents through ssh
    pbs = tmp_path / "pbs_nodes"
    pbs.write_text("c1\nc1\nc2\n")
    found = discover_allocation({"PBS_NODEFILE": str(pbs)})
    assert found.kind == "pbs" and [(n.name, n.cores) for n in found.nodes] == [("c1", 2),
                                                                               ("c2", 1)]
    assert found.agent_launcher == SSH_AGENT_LAUNCHER
    pe = tmp_path / "pe"
    pe.write_text("g1 3 all.q@g1 UNDEFINED\n")
    assert [(n.name, n.cores) for n in discover_allocation({"PE_HOSTFILE": str(pe)}).nodes] \
        == [("g1", 3)]
    djob = tmp_path / "djob"
    djob.write_text("l1\nl2\nl2\n")
    lsf = discover_allocation({"LSB_DJOB_HOSTFILE": str(djob), "LSB_MCPU_HOSTS": "x 9"})
    assert lsf.kind == "lsf" and [(n.name, n.cores) for n in lsf.nodes] == [("l1", 1), ("l2", 2)]
    mcpu = discover_allocation({"LSB_MCPU_HOSTS": "h1 4 h2 2"})
    assert [(n.name, n.cores) for n in mcpu.nodes] == [("h1", 4), ("h2", 2)]
    with pytest.raises(ValueError, match="PBS_NODEFILE: cannot read the host file"):
        discover_allocation({"PBS_NODEFILE": str(tmp_path / "missing")})
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/mpirun")
    assert discover_allocation({"PBS_NODEFILE": str(pbs)}).agent_launcher \
        == MPIRUN_AGENT_LAUNCHER


def test_configured_allocations_are_checked() -> None:
    virtual = configured_allocation([("vnode1", 1), NodeSpec("vnode2", 2)])
    assert virtual.local_node is None and virtual.remote_nodes == ("vnode1", "vnode2")
    assert virtual.agent_launcher == ()
    with pytest.raises(ValueError, match="Allocation.local_node: 'x' is not one of the nodes"):
        configured_allocation([("a", 1)], local_node="x")
    with pytest.raises(ValueError, match="node names must be unique"):
        Allocation((NodeSpec("a", 1), NodeSpec("a", 1)), None)
    with pytest.raises(TypeError, match=r"nodes\[0\]: expected NodeSpec or a \(name, cores\)"):
        configured_allocation(["a"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="Allocation.kind: 'moab' is not one of"):
        Allocation((NodeSpec("a", 1),), None, "moab")
