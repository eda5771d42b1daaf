"""Rank, world and rendezvous from each launcher's variables (no processes started)."""

import pytest

from microbench.ranks.dist import detect, first_slurm_host, slurm_port


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "h1",
      "MASTER_PORT": "1234"}, ("torchrun", 3, 4, 1, "h1", 1234)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "8",
      "OMPI_COMM_WORLD_LOCAL_RANK": "2"}, ("openmpi", 2, 8, 2, "127.0.0.1", 29500)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"},
     ("pmi", 1, 2, 1, "127.0.0.1", 29500)),
    # srun: the first node of the job and a port derived from the job id (20000 + 4242).
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "4242",
      "SLURM_JOB_NODELIST": "gpu[003-004]"}, ("slurm", 5, 8, 1, "gpu003", 24242)),
    # srun --mpi=pmi2 sets PMI_* too: PMI wins, and Slurm still gives the rendezvous.
    ({"PMI_RANK": "0", "PMI_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "4",
      "SLURM_JOB_ID": "45000", "SLURM_STEP_NODELIST": "n1,n2"},
     ("pmi", 0, 4, 0, "n1", 25000)),
    # srun --mpi=pmi2: no MPI_LOCALRANKID (Hydra's), so the local rank is SLURM_LOCALID.
    ({"PMI_RANK": "5", "PMI_SIZE": "8", "SLURM_PROCID": "5", "SLURM_NTASKS": "8",
      "SLURM_LOCALID": "1", "SLURM_JOB_ID": "45000", "SLURM_STEP_NODELIST": "n1,n2"},
     ("pmi", 5, 8, 1, "n1", 25000)),
    # srun --mpi=cray_shasta (Cray MPICH): PMI_RANK, PMI_SIZE, PMI_LOCAL_RANK from Slurm's
    # plugin (src/plugins/mpi/cray_shasta/mpi_cray_shasta.c @ b5076411), and SLURM_LOCALID;
    # task 6 of 8 on two nodes of 4 is local rank 2 on the second.
    ({"PMI_RANK": "6", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "2", "SLURM_PROCID": "6",
      "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_JOB_ID": "45000",
      "SLURM_STEP_NODELIST": "x1000c0s0b0n0,x1000c0s0b0n1"},
     ("pmi", 6, 8, 2, "x1000c0s0b0n0", 25000)),
    # PMI_LOCAL_RANK without Slurm's variables: still the local rank.
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "1"},
     ("pmi", 3, 4, 1, "127.0.0.1", 29500)),
    # mpiexec (Hydra) inside an allocation: its proxy's SLURM_LOCALID (0) is not the rank's.
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "SLURM_PROCID": "0",
      "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "45000"},
     ("pmi", 3, 4, 1, "127.0.0.1", 25000)),
])
def test_detect(env, expected):
    d = detect(env)
    assert (d.launcher, d.rank, d.world_size, d.local_rank, d.master_addr,
            d.master_port) == expected


def test_no_launcher():
    assert detect({"HOME": "/root"}) is None


@pytest.mark.parametrize("nodelist, first", [("node1", "node1"), ("n[1-2]", "n1"),
                                             ("gpu[009,011-012],login", "gpu009"),
                                             ("a-b[10-11]", "a-b10")])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


def test_slurm_port_without_job():
    assert slurm_port("") == 29500 and slurm_port("39999") == 39999


def test_local_rank_names_its_variable():
    srun_pmi2 = {"PMI_RANK": "5", "PMI_SIZE": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1"}
    assert detect(srun_pmi2).local_var == "SLURM_LOCALID"
    assert detect({"PMI_RANK": "0", "PMI_SIZE": "1"}).local_var == ""  # none set: unknown
