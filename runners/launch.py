"""Start the ranks through torch.distributed.run's launcher, tell why a run failed, leave no process.

`launch(argv)` runs torchrun's elastic agent in this process. Around it:

- a watch thread samples the rank processes twice a second and remembers which ones are stopped
  (SIGSTOP, Ctrl-Z, a debugger). A stopped rank cannot act on the launcher's SIGTERM; torchrun
  would SIGKILL it 30 s later and report "killed by signal 9", as if it had crashed. The watch kills
  it as soon as the SIGTERM is pending, and the report names it as not responding, like a hang.
- whatever happens (a failed rank, an error while the processes are being created, Ctrl-C), every
  process started for the run is killed and waited for before `launch` returns: this process is
  made a child subreaper, so a rank's own children stay findable after their parent died.
"""

from __future__ import annotations

import ctypes
import errno
import signal
import sys
import threading
import time

import psutil

# Errors a rank raises because a *peer* died or hung, not because it failed itself.
_PEER_SYMPTOMS = (
    "connection closed by peer",
    "connection reset",
    "broken pipe",
    "timed out",
    "timeout",
    "nccl communicator was aborted",
    "distnetworkerror",
)
_WATCH_INTERVAL_S = 0.5
_STOPPED = (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)


def launch(argv: list[str]) -> str | None:
    """Run torch.distributed.run's launcher on `argv`; return a failure line or None.

    Every process started here, and any process those started, is gone when this returns.
    """
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    # torchrun's agent logs every rendezvous step at WARNING/INFO; the failure report below says
    # what matters.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    config, cmd, cmd_args = config_from_args(parse_args(argv))
    _become_subreaper()
    before = {p.pid for p in _children()}  # e.g. a test runner's other children: not ours to kill
    watch = RankWatch(before)
    watch.start()
    try:
        elastic_launch(config, cmd)(*cmd_args)
    except ChildFailedError as err:
        failures = {rank: (f.exitcode, f.message) for rank, f in err.failures.items()}
        return describe_failures(failures, config.nproc_per_node * config.max_nodes, stopped=watch.stopped_ranks())
    except KeyboardInterrupt:
        return "interrupted; all ranks stopped"
    except OSError as err:  # creating a rank's process (fork: EAGAIN under a process limit, ENOMEM, ...)
        name = errno.errorcode.get(err.errno or 0, "")
        return f"could not start the rank processes: {err.strerror or err} ({name}); every started rank was stopped"
    except Exception as err:  # rendezvous or launcher trouble: say what, not a traceback
        return f"the launcher failed before the ranks finished: {type(err).__name__}: {err}"
    finally:
        watch.halt()
        reap_descendants(exclude=before)
    return None


def _become_subreaper() -> None:
    # PR_SET_CHILD_SUBREAPER: orphaned descendants are re-parented to us, not to init, so a rank's
    # children stay in our process tree (findable, and reaped by us) after the rank is gone.
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)
        except OSError:
            pass


def _children(recursive: bool = False) -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=recursive)
    except psutil.Error:
        return []


def reap_descendants(exclude: set[int] = frozenset(), timeout_s: float = 30.0) -> list[int]:
    """SIGKILL every descendant of this process (but `exclude`d children and theirs), and wait for
    each; returns the pids that were still alive and had to be killed."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs = [p for p in _children() if p.pid not in exclude]
        for child in list(procs):
            try:
                procs += child.children(recursive=True)
            except psutil.Error:
                continue
        if not procs:
            break
        for proc in procs:
            try:
                proc.kill()
                killed.append(proc.pid)
            except psutil.Error:
                continue
        # Short rounds: a grandchild becomes our child (subreaper) only once its parent is reaped,
        # and only a parent can reap; the next round waits for it as a child.
        psutil.wait_procs(procs, timeout=1.0)
    return sorted(set(killed))


def _sigterm_pending(pid: int) -> bool:
    """SIGTERM is queued for `pid` (it cannot act on it: it is stopped), from /proc/<pid>/status."""
    try:
        with open(f"/proc/{pid}/status") as f:
            masks = [int(line.split()[1], 16) for line in f if line.startswith(("SigPnd:", "ShdPnd:"))]
    except (OSError, ValueError, IndexError):
        return False
    return any(mask & (1 << (signal.SIGTERM - 1)) for mask in masks)


class RankWatch(threading.Thread):
    """Samples the rank processes: which global ranks are stopped; kills a stopped one that the
    launcher has asked to terminate (it would otherwise wait out torchrun's 30 s grace)."""

    def __init__(self, exclude: set[int]):
        super().__init__(name="ptprof-rank-watch", daemon=True)
        self._exclude = exclude
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._stopped: set[int] = set()
        self._rank_of: dict[int, int] = {}  # pid -> global rank (RANK in its environment)

    def stopped_ranks(self) -> frozenset[int]:
        """Ranks last seen stopped: those that ended while stopped, or still are."""
        with self._lock:
            return frozenset(self._stopped)

    def halt(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def run(self) -> None:
        while not self._halt.wait(_WATCH_INTERVAL_S):
            for proc in _children():
                if proc.pid not in self._exclude:
                    self._sample(proc)

    def _sample(self, proc: psutil.Process) -> None:
        try:
            if proc.pid not in self._rank_of:
                rank = proc.environ().get("RANK")
                if not (rank and rank.isdigit()):
                    return  # not exec'd yet (the launcher's environment), or not a rank: look again later
                self._rank_of[proc.pid] = int(rank)
            rank = self._rank_of[proc.pid]
            stopped = proc.status() in _STOPPED
        except (psutil.Error, OSError):
            return
        with self._lock:
            (self._stopped.add if stopped else self._stopped.discard)(rank)
        if stopped and _sigterm_pending(proc.pid):
            try:
                proc.kill()  # what torchrun does after its 30 s grace; the report knows why
            except psutil.Error:
                pass


def _last_line(message, limit: int = 240) -> str:
    if isinstance(message, dict):  # torchrun's error file nests {"message": ..., "extraInfo": ...}
        message = message.get("message", message)
    lines = [ln.strip() for ln in str(message).strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else "no message"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe_failures(
    failures: dict[int, tuple[int, object]], world_size: int, stopped: frozenset[int] = frozenset()
) -> str:
    """One line naming the failing rank(s) and why, from torchrun's per-rank (exitcode, message).

    Four kinds of failed rank: a *cause* raised its own error or died of a signal other than
    SIGTERM; a *symptom* raised because a peer went away or a collective timed out; a *stopped*
    rank was terminated by the launcher (SIGTERM) without an error of its own; a *frozen* rank (in
    `stopped`: its process was seen stopped, SIGSTOP or a debugger, when it ended) was killed
    because it could not stop. When only symptoms, stopped, frozen or absent ranks remain, the
    stopped, frozen and absent ones are the culprits: they did not respond.
    """
    causes, symptoms, halted = [], [], []
    for rank in sorted(failures):
        exitcode, message = failures[rank]
        text = str(message).lower()
        if rank in stopped:
            halted.append(rank)
        elif any(s in text for s in _PEER_SYMPTOMS):
            symptoms.append(rank)
        elif exitcode == -15 and "sigterm" in text:
            halted.append(rank)
        else:
            causes.append(rank)
    if causes:
        parts = []
        for rank in causes:
            exitcode, message = failures[rank]
            how = f"killed by signal {-exitcode}" if exitcode < 0 else f"exit {exitcode}"
            parts.append(f"rank {rank} failed ({how}): {_last_line(message)}")
        return "; ".join(parts)
    culprits = sorted(set(halted) | (set(range(world_size)) - set(failures)))
    waiting = ", ".join(map(str, symptoms))
    first = _last_line(failures[symptoms[0]][1]) if symptoms else "no message"
    if culprits:
        who = ", ".join(map(str, culprits))
        frozen = sorted(set(culprits) & stopped)
        why = "hung or too slow"
        if frozen:
            why = f"rank {', '.join(map(str, frozen))}'s process was stopped: SIGSTOP, Ctrl-Z or a debugger"
            if len(frozen) < len(culprits):
                why += "; the others hung or were too slow"
        line = f"rank {who} stopped responding ({why})"
        return line + (f"; rank {waiting} gave up waiting: {first}" if symptoms else "")
    return f"rank {waiting} failed in a collective: {first}"
