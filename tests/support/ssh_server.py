"""A real OpenSSH login on this machine for the tests that submit over ssh.

The test sshd is started by ``tests/setup/start-sshd.sh`` (``make schedulers``) on 127.0.0.1,
port ``PSIJ_SSHD_PORT`` (60022), key authentication only; its run directory
``/run/psij-test-sshd`` (root's, 0700) holds its host key line for clients (``known_hosts``)
and the port it listens on (``port``).

:func:`make_ssh_user` makes a real local user (home under /home, /bin/bash, its own group)
with an ed25519 key pair and a client configuration of its own; the key and the configuration
live in a root-owned 0700 directory (files 0600), the public key in the user's
``~/.ssh/authorized_keys``. :meth:`SshUser.remove` takes it all away again.

The other side runs this checkout's psij as that user: :func:`remote_psij_command` gives a
psij the user can run. The checkout's own ``.venv/bin/psij`` is that psij when another user can
run its interpreter; a virtual environment whose interpreter lives in a folder others cannot
enter (pyenv's under /root, mode 0700) cannot be run by the user, and then the command is a
small bridge environment on a system Python of the same version that imports the checkout's
installed packages (made once per test process, removed at its exit).

The user's non-interactive ssh sessions reach the real schedulers as they are: Slurm's
commands need nothing more (an association in Slurm's accounting is added only when Slurm
enforces them), and the Debian Grid Engine wrappers default SGE_ROOT to /var/lib/gridengine and
SGE_CELL to default.
"""

import atexit
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

RUN_DIR = Path("/run/psij-test-sshd")
SSHD = Path("/usr/sbin/sshd")
SETUP = Path(__file__).resolve().parent.parent / "setup"
DEFAULT_PORT = 60022
HOST = "127.0.0.1"
NOBODY = 65534
START_HINT = "tests/setup/start-sshd.sh starts it as root, as make schedulers does"


# ------------------------------------------------------------------ the test sshd

def sshd_port() -> int:
    """The port of the test sshd: the one it was started on, else ``PSIJ_SSHD_PORT``."""
    try:
        return int((RUN_DIR / "port").read_text().strip())
    except (OSError, ValueError):
        return int(os.environ.get("PSIJ_SSHD_PORT", DEFAULT_PORT))


def _listener_pid() -> Optional[int]:
    """The pid of the test sshd's listener when it runs (started by start-sshd.sh)."""
    try:
        if not (RUN_DIR / "started.sshd").is_file():
            return None
        pid = int((RUN_DIR / "sshd.pid").read_text().strip())
        if Path(f"/proc/{pid}/comm").read_text().strip() != "sshd":
            return None
        state = Path(f"/proc/{pid}/status").read_text()
    except (OSError, ValueError):
        return None
    return None if re.search(r"^State:\s*Z", state, re.M) else pid


def _banner(port: int, timeout: float = 3.0) -> bytes:
    """The first bytes 127.0.0.1:``port`` sends (b"" when nothing answers)."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as conn:
            return conn.recv(64)
    except OSError:
        return b""


def sshd_reason() -> Optional[str]:
    """Why the ssh tests cannot run here, or None when the test sshd is there to use."""
    if os.geteuid() != 0:
        return "not root: the ssh tests make local users and need the test sshd (root's)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is missing (tests/setup/system-deps.sh installs openssh-server as root)"
    for tool in ("ssh", "ssh-keygen", "useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (openssh-client, passwd)"
    if _listener_pid() is None:
        return f"the test sshd is not running ({START_HINT})"
    port = sshd_port()
    if not _banner(port).startswith(b"SSH-"):
        return f"the test sshd does not answer on {HOST}:{port} ({START_HINT})"
    if not (RUN_DIR / "known_hosts").is_file():
        return f"{RUN_DIR}/known_hosts is missing ({START_HINT})"
    return None


def restart_sshd(timeout: float = 60.0) -> None:
    """Stop the test sshd's listener and start it again, waiting until it answers.

    Only the listener is stopped (TERM): the sessions it had accepted are processes of their
    own (a root monitor ``sshd: USER [priv]``, the user's ``sshd: USER@notty`` and the command
    it runs) and go on to their end, their connections intact; no new connection is accepted
    until the listener is back (a client then gets "Connection refused"). The host key, port
    and configuration stay the same.
    """
    env = {**os.environ, "PSIJ_SSHD_PORT": str(sshd_port())}
    for script in ("stop-sshd.sh", "start-sshd.sh"):
        done = subprocess.run(["bash", str(SETUP / script)], env=env, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{script} failed ({done.returncode}): "
                               f"{done.stdout}{done.stderr}")
    if _listener_pid() is None or not _banner(sshd_port()).startswith(b"SSH-"):
        raise RuntimeError("the test sshd did not come back")


# ------------------------------------------------------------------ the psij of the other side

def checkout_psij() -> Path:
    """This checkout's ``.venv/bin/psij``: next to the interpreter running the tests."""
    return Path(os.path.normpath(os.path.abspath(sys.executable))).parent / "psij"


def _as_nobody(argv: Sequence[str], timeout: float = 60.0) -> "subprocess.CompletedProcess[str]":
    """Run ``argv`` as user and group nobody, without supplementary groups, from /."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8"}
    return subprocess.run(list(argv), user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
                          env=env, capture_output=True, text=True, timeout=timeout)


def _runs_for_others(argv: Sequence[str]) -> bool:
    try:
        return _as_nobody(argv).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


class _Remote:
    """What the other side runs (found once per process): psij and its python, or why none."""

    def __init__(self) -> None:
        self.psij: Optional[Path] = None
        self.python: Optional[Path] = None
        self.reason: Optional[str] = None
        self.looked = False


_REMOTE = _Remote()


def _system_pythons() -> List[Path]:
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    seen: List[Path] = []
    for candidate in (f"/usr/bin/python{version}", f"/usr/local/bin/python{version}",
                      "/usr/bin/python3", "/usr/local/bin/python3"):
        path = Path(candidate)
        if path.is_file() and os.access(path, os.X_OK) and path.resolve() not in seen:
            seen.append(path.resolve())
    return seen


def _same_version(python: Path) -> bool:
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    try:
        done = _as_nobody([str(python), "-c", probe])
    except (OSError, subprocess.SubprocessError):
        return False
    wanted = f"{sys.version_info[0]}.{sys.version_info[1]}"
    return done.returncode == 0 and done.stdout.strip() == wanted


def _bridge(python: Path) -> Path:
    """A virtual environment on ``python`` (one others can run) whose site-packages load this
    checkout's (``.pth`` files included, so the editable psij too); returns its psij."""
    top = Path(tempfile.mkdtemp(prefix="psij-remote-python-"))
    atexit.register(shutil.rmtree, top, True)
    top.chmod(0o755)
    env_dir = top / "venv"
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(env_dir)], check=True,
                   capture_output=True, timeout=120)
    purelib = Path(subprocess.run(
        [str(env_dir / "bin" / "python"), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60).stdout.strip())
    ours = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in ours)
    (purelib / "psij-checkout.pth").write_text(lines)
    entry = checkout_psij().read_text().split("\n", 1)
    script = env_dir / "bin" / "psij"
    script.write_text(f"#!{env_dir / 'bin' / 'python'}\n{entry[1] if len(entry) > 1 else ''}")
    script.chmod(0o755)
    for path in (top, *top.rglob("*")):  # open to others whatever the umask was
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or path.stat().st_mode & 0o111 else 0o644)
    return script


def _find_remote() -> _Remote:
    if _REMOTE.looked:
        return _REMOTE
    _REMOTE.looked = True
    psij = checkout_psij()
    if not psij.is_file():
        _REMOTE.reason = f"{psij} is missing: the tests do not run from a checkout's .venv"
        return _REMOTE
    if _runs_for_others([str(psij), "--version"]):
        _REMOTE.psij, _REMOTE.python = psij, psij.parent / "python"
        return _REMOTE
    problems = [f"{psij}'s interpreter {Path(sys.executable).resolve()} cannot be run by "
                f"other users (a folder on its path is closed to them)"]
    for python in _system_pythons():
        if not _same_version(python):
            problems.append(f"{python} is not Python {sys.version_info[0]}.{sys.version_info[1]}"
                            f" or cannot be run by others")
            continue
        try:
            bridge = _bridge(python)
        except (OSError, subprocess.SubprocessError) as e:
            problems.append(f"no environment on {python}: {e}")
            continue
        if _runs_for_others([str(bridge), "--version"]):
            _REMOTE.psij, _REMOTE.python = bridge, bridge.parent / "python"
            return _REMOTE
        problems.append(f"{bridge} cannot be run by others")
    _REMOTE.reason = "; ".join(problems)
    return _REMOTE


def remote_psij_reason() -> Optional[str]:
    """Why no psij of this checkout can be run by another user here, or None."""
    return _find_remote().reason


def remote_psij_command() -> str:
    """The absolute path of a psij of this checkout that another local user can run: the
    checkout's ``.venv/bin/psij`` when its interpreter is open to others, else the bridge's
    (see the module's text). Raises RuntimeError when there is none (remote_psij_reason)."""
    remote = _find_remote()
    if remote.psij is None:
        raise RuntimeError(f"no psij another user can run: {remote.reason}")
    return str(remote.psij)


def remote_python() -> str:
    """The python of :func:`remote_psij_command` (it imports this checkout's psij)."""
    remote_psij_command()
    return str(_find_remote().python)


# ------------------------------------------------------------------ users with a key

def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    """Write a new file (no link followed, none there before) with ``mode``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                    "-f", str(path)], check=True, capture_output=True, timeout=60)
    path.chmod(0o600)
    Path(f"{path}.pub").chmod(0o600)


def _client_config(alias: str, port: int, user: str, key: Path, known_hosts: Path) -> str:
    return "\n".join([
        f"Host {alias}",
        f"    HostName {HOST}",
        f"    Port {port}",
        f"    User {user}",
        f"    IdentityFile {key}",
        "    IdentitiesOnly yes",
        "    IdentityAgent none",
        "    BatchMode yes",
        "    PasswordAuthentication no",
        "    KbdInteractiveAuthentication no",
        f"    UserKnownHostsFile {known_hosts}",
        "    GlobalKnownHostsFile /dev/null",
        "    StrictHostKeyChecking yes",
        "    UpdateHostKeys no",
        "    ConnectTimeout 15",
        "    ServerAliveInterval 15",
        "    ControlMaster no",
        "    ControlPath none",
        "    ForwardAgent no",
        "    ForwardX11 no",
        "",
    ])


def _slurm_association_needed() -> bool:
    """Slurm refuses jobs of users without an association only when it enforces them."""
    if shutil.which("scontrol") is None or shutil.which("sacctmgr") is None:
        return False
    try:
        shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                               timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    found = re.search(r"^AccountingStorageEnforce\s*=\s*(\S*)", shown, re.M)
    enforced = found.group(1).lower() if found else "none"
    return any(word in enforced for word in ("associations", "limits", "qos", "safe"))


def _sacctmgr(*words: str) -> None:
    subprocess.run(["sacctmgr", "-i", *words], capture_output=True, timeout=60)


def _uids_of(pid: str) -> List[int]:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return []
    found = re.search(r"^Uid:\s*(.*)$", status, re.M)
    return [int(u) for u in found.group(1).split()] if found else []


def user_pids(uid: int) -> List[int]:
    """The live processes with ``uid`` as one of their user ids."""
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and uid in _uids_of(pid)
            and not re.search(r"^State:\s*Z", _read(f"/proc/{pid}/status"), re.M)]


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _scheduler_env() -> Dict[str, str]:
    return {"SGE_ROOT": "/var/lib/gridengine", "SGE_CELL": "default", **os.environ}


class SshUser(NamedTuple):
    """A local user who logs in to the test sshd with a key (made by :func:`make_ssh_user`)."""

    name: str
    uid: int
    gid: int
    home: Path
    private_dir: Path  # root's, 0700: the keys, configurations and known_hosts files
    key: Path
    config: Path
    alias: str
    port: int
    slurm_association: bool

    def ssh_argv(self, *remote_cmd: str, config: Optional[Path] = None) -> List[str]:
        """``ssh -F CONFIG ALIAS REMOTE_CMD...``. As with ssh itself, the words are joined by
        spaces and read by the user's shell on the other side (shlex.join keeps them exact)."""
        return ["ssh", "-F", str(config or self.config), self.alias, *remote_cmd]

    def run(self, command: str, timeout: float = 120.0,
            config: Optional[Path] = None) -> "subprocess.CompletedProcess[str]":
        """Run the shell command ``command`` over ssh as the user; its output as text."""
        return subprocess.run(self.ssh_argv(command, config=config), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def unknown_host_config(self) -> Path:
        """A configuration that knows no host key (an empty known_hosts, strict checking):
        ssh refuses the test sshd with "Host key verification failed"."""
        known = self.private_dir / "known_hosts.empty"
        if not known.exists():
            _write_private(known, "")
        config = self.private_dir / "config.unknown-host"
        if not config.exists():
            _write_private(config, _client_config(self.alias, self.port, self.name, self.key,
                                                  known))
        return config

    def wrong_key_config(self) -> Path:
        """A configuration with a key the user's authorized_keys does not hold: the test sshd
        refuses it with "Permission denied (publickey)"."""
        key = self.private_dir / "id_ed25519.wrong"
        if not key.exists():
            _keygen(key, f"{self.name}-not-authorized")
        config = self.private_dir / "config.wrong-key"
        if not config.exists():
            _write_private(config, _client_config(self.alias, self.port, self.name, key,
                                                  self.private_dir / "known_hosts"))
        return config

    def remove(self, timeout: float = 30.0) -> None:
        """Take the user away: its Slurm and Grid Engine jobs (scancel -u, qdel -u), its
        processes (KILL until none is left), the user, its group and home (userdel -r), its
        Slurm association if one was added, and the private directory."""
        env = _scheduler_env()
        for argv in (["scancel", "-u", self.name], ["qdel", "-u", self.name]):
            if shutil.which(argv[0]):
                try:
                    subprocess.run(argv, capture_output=True, timeout=60, env=env)
                except (OSError, subprocess.SubprocessError):
                    pass
        end = time.monotonic() + timeout
        while True:
            pids = user_pids(self.uid)
            if not pids:
                break
            if time.monotonic() > end:
                raise RuntimeError(f"processes of {self.name} outlive KILL: {pids}")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.1)
        while True:
            done = subprocess.run(["userdel", "-r", self.name], capture_output=True, text=True,
                                  timeout=60)
            try:
                pwd.getpwnam(self.name)
            except KeyError:
                break
            if time.monotonic() > end:
                raise RuntimeError(f"userdel -r {self.name} failed: {done.stderr.strip()}")
            for pid in user_pids(self.uid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.2)
        home = self.home
        if home.is_dir() and not home.is_symlink() and home.stat().st_uid == self.uid:
            shutil.rmtree(home, ignore_errors=True)  # what userdel -r left
        if self.slurm_association:
            _sacctmgr("delete", "user", f"name={self.name}")
        shutil.rmtree(self.private_dir, ignore_errors=True)


def make_ssh_user(prefix: str = "psijssh") -> SshUser:
    """A new local user ``<prefix><6 hex digits>`` (home /home/NAME, /bin/bash, its own group)
    who logs in to the test sshd with a new ed25519 key; call :meth:`SshUser.remove` after."""
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,20}", prefix):
        raise ValueError(f"{prefix!r}: a user name prefix of at most 21 of [a-z0-9_-] is wanted")
    reason = sshd_reason()
    if reason is not None:
        raise RuntimeError(reason)
    name = f"{prefix}{secrets.token_hex(3)}"
    home = Path("/home") / name
    subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--user-group",
                    "--shell", "/bin/bash", name], check=True, capture_output=True, timeout=60)
    entry = pwd.getpwnam(name)
    port = sshd_port()
    private = Path(tempfile.mkdtemp(prefix=f"psij-ssh-{name}-"))
    association = False
    user = SshUser(name, entry.pw_uid, entry.pw_gid, home, private, private / "id_ed25519",
                   private / "config", f"psij-test-{name}", port, association)
    try:
        st = os.lstat(home)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != entry.pw_uid:
            raise RuntimeError(f"{home} is not {name}'s directory")
        home.chmod(0o755)  # StrictModes: no group or other may write on the way to the keys
        _keygen(user.key, f"{name}@psij-test")
        known = private / "known_hosts"
        _write_private(known, (RUN_DIR / "known_hosts").read_text())
        _write_private(user.config, _client_config(user.alias, port, name, user.key, known))
        dot_ssh = home / ".ssh"
        os.mkdir(dot_ssh, 0o700)
        os.chown(dot_ssh, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
        authorized = dot_ssh / "authorized_keys"
        _write_private(authorized, Path(f"{user.key}.pub").read_text())
        os.chown(authorized, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
        if _slurm_association_needed():
            account = subprocess.run(
                ["sacctmgr", "-n", "-P", "show", "account", "format=account"],
                capture_output=True, text=True, timeout=60).stdout.split()
            _sacctmgr("add", "user", name, f"account={account[0] if account else 'root'}")
            user = user._replace(slurm_association=True)
    except BaseException:
        user.remove()
        raise
    return user
