"""A real single-node SLURM cluster (munged + slurmctld + slurmd) on loopback inside a temp dir, for tests.

Every file (munge key and socket, slurm.conf, state, spool, logs, pids) lives under the base dir; nothing
in /etc/munge, /run/munge or /etc/slurm is touched. Client commands find the cluster through ``SLURM_CONF``
(pass ``cluster.env`` to subprocesses); jobs inherit it through sbatch's default ``--export=ALL``, so
``srun`` inside a batch script works too.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE"}


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def available() -> str | None:
    """None if the SLURM and munge binaries are installed (and we are root), else why not."""
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        return "SLURM/munge binaries not found: " + ", ".join(missing)
    if os.geteuid() != 0:
        return "the local SLURM cluster runs its daemons as root (SlurmUser=root)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Runs in the daemon child before exec: SIGTERM it if the test process dies without stop()."""
    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class LocalSlurm:
    """Start with ``start()`` (or ``with LocalSlurm(dir) as c:``), stop with ``stop()`` (idempotent)."""

    def __init__(self, base: Path, cluster: str = "pytest", min_job_age: int = 300, cred_expire: int = 10):
        self.base = Path(base).resolve()
        self.cluster, self.min_job_age, self.cred_expire = cluster, min_job_age, cred_expire
        self.node = socket.gethostname().split(".")[0] or "localhost"
        self.conf = self.base / "slurm.conf"
        self.munge_socket = self.base / "munge" / "munge.socket"
        self.jobcomp = self.base / "jobcomp.txt"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for k in [k for k in self.env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SQUEUE_")) and k != "SLURM_CONF"]:
            del self.env[k]  # do not leak an outer job's settings into ours
        self.procs: dict[str, subprocess.Popen] = {}

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> "LocalSlurm":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> "LocalSlurm":
        """Write the configs, start munged, slurmctld and slurmd, and wait for the node to be idle."""
        for sub in ("munge", "state", "spool", "log", "run"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge()
            self._write_conf()
            for name, extra in (("slurmctld", ["-c", "-i"]), ("slurmd", ["-N", self.node])):
                self._spawn(name, [_which(name), "-D", "-f", str(self.conf), *extra])
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Cancel jobs, then terminate (then kill) slurmd, slurmctld, munged and leftover job processes."""
        if not self.procs:
            return
        pids = self._job_pids()
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--quiet", "--user", "root"], env=self.env,
                           capture_output=True, timeout=15, check=False)
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self._kill_leftovers(pids | self._job_pids())
        self.procs.clear()

    # -- client helpers ----------------------------------------------------------------------------
    def run(self, *cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run a SLURM client command against this cluster, capturing text output."""
        return subprocess.run(list(cmd), env=self.env, capture_output=True, text=True, check=check, **kw)

    def sbatch(self, args: list[str], cwd: str | Path | None = None) -> int:
        """Submit with ``sbatch --parsable ARGS`` and return the job id."""
        out = subprocess.run(["sbatch", "--parsable", *args], env=self.env, cwd=cwd, capture_output=True,
                             text=True)
        if out.returncode:
            raise RuntimeError(f"sbatch {args} failed: {out.stderr.strip()}")
        return int(out.stdout.strip().split(";")[0])

    def state(self, job_id: int | str) -> str:
        """JobState from ``scontrol show job`` (an array: a pending/running task's state if any, else a failed
        task's, else COMPLETED), else the last jobcomp record, else ``UNKNOWN``."""
        out = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        states = [f.split("=", 1)[1] for line in out.stdout.splitlines() for f in line.split()
                  if f.startswith("JobState=")]
        if states:
            live = [s for s in states if s not in FINAL_STATES]
            bad = [s for s in states if s != "COMPLETED"]
            return (live or bad or states)[0]
        return self._jobcomp_state(str(job_id)) or "UNKNOWN"

    def wait(self, job_id: int | str, timeout: float = 60.0, poll: float = 0.5) -> str:
        """Poll until the job reaches a final state and return it; raise TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.state(job_id)
            if st in FINAL_STATES:
                return st
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {st} after {timeout}s")
            time.sleep(poll)

    def requeue(self, job_id: int | str, prompt: bool = True, timeout: float = 30.0) -> None:
        """``scontrol requeue``; with ``prompt``, once the job is PENDING again, drop the BeginTime delay
        (cred_expire + 1 s) SLURM puts on requeued jobs (``StartTime=now`` only works once it is PENDING)."""
        self.run("scontrol", "requeue", str(job_id))
        if prompt:
            self._until(lambda: self.state(job_id) == "PENDING", timeout, f"job {job_id} did not get requeued")
            self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    # -- internals ---------------------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.base / "log" / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        log.close()

    def _start_munge(self) -> None:
        d = self.base / "munge"
        d.chmod(0o755)  # munged wants a socket dir that is not group/world-writable
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        # --foreground logs to stderr (log/munged.out); --force because we are root
        self._spawn("munged", [_which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={d / 'munged.pid'}", f"--seed-file={d / 'munged.seed'}"])
        self._until(lambda: self.munge_socket.exists(), 10, "munged did not create its socket")

    def _write_conf(self) -> None:
        b, cpus = self.base, os.cpu_count() or 1
        with open("/proc/meminfo") as f:
            mem_mb = int(f.readline().split()[1]) // 1024
        self.conf.write_text(f"""\
ClusterName={self.cluster}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket},cred_expire={self.cred_expire}
CredType=cred/munge
StateSaveLocation={b / 'state'}
SlurmdSpoolDir={b / 'spool'}
SlurmctldPidFile={b / 'run' / 'slurmctld.pid'}
SlurmdPidFile={b / 'run' / 'slurmd.pid'}
SlurmctldLogFile={b / 'log' / 'slurmctld.log'}
SlurmdLogFile={b / 'log' / 'slurmd.log'}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={self.jobcomp}
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
ReturnToService=2
JobRequeue=1
SlurmctldTimeout=10
SlurmdTimeout=10
InactiveLimit=0
MinJobAge={self.min_job_age}
KillWait=5
Waittime=0
MailProg=/bin/true
NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname={self.node} CPUs={cpus} RealMemory={max(mem_mb // 2, 256)} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES State=UP MaxTime=INFINITE
""")

    def _wait_idle(self, timeout: float) -> None:
        def idle() -> bool:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}\n{self._logs()}")
            out = self.run("sinfo", "-h", "-N", "-o", "%t", check=False)
            return out.returncode == 0 and out.stdout.strip() == "idle"

        self._until(idle, timeout, "the SLURM node did not become idle")

    def _until(self, cond, timeout: float, msg: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{msg} within {timeout}s\n{self._logs()}")
            time.sleep(0.2)

    def _logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{_tail(p)}" for p in sorted((self.base / "log").glob("*")))

    def _jobcomp_state(self, job_id: str) -> str | None:
        try:
            lines = self.jobcomp.read_text(errors="replace").splitlines()
        except OSError:
            return None
        for line in reversed(lines):  # the last record wins (a requeued job has several)
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if fields.get("JobId") == job_id or job_id == f"{fields.get('ArrayJobId')}_{fields.get('ArrayTaskId')}":
                return fields.get("JobState")
        return None

    def _job_pids(self) -> set[int]:
        """Pids of processes (slurmstepd, job scripts, srun) carrying our SLURM_CONF in their environment."""
        marker, pids = f"SLURM_CONF={self.conf}".encode(), set()
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and int(proc.name) != os.getpid() and \
                        marker in (proc / "environ").read_bytes().split(b"\0"):
                    pids.add(int(proc.name))
            except OSError:
                pass
        return pids

    def _kill_leftovers(self, pids: set[int], timeout: float = 5.0) -> None:
        """SIGKILL job processes and wait until they are reaped (zombies would still show up in pgrep)."""
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
