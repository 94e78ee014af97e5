"""The sd-scripts checkout kohya-tuner launches: where it is, how to get it, and
whether it is the release kohya-tuner was built against.

The pin lives in `vendor/sd-scripts/pin.toml`; the argument set at that commit in
`vendor/sd-scripts/args.json`. A checkout at another commit (or a bare folder of
entry scripts) is compared with the pin by reading its `add_argument` calls with
`ast`: importing it would need torch and the whole trainer environment, and running
a stranger's code just to inspect it is not acceptable anyway.

Git is driven through the real `git` binary with argument lists, never a shell.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import toml

from kohya_tuner import schema
from kohya_tuner.errors import UserError
from kohya_tuner.printable import printable
from kohya_tuner.resources import user_data_dir, vendor_file

ENV_VAR = "KOHYA_SD_SCRIPTS"
# A kohya_ss GUI install keeps sd-scripts as a submodule under this name.
GUI_SUBDIR = "sd-scripts"


# ---- the pin -----------------------------------------------------------------------


@lru_cache(maxsize=None)
def pin() -> dict[str, Any]:
    with open(vendor_file("sd-scripts", "pin.toml"), encoding="utf-8") as fh:
        return toml.load(fh)


def pinned_commit() -> str:
    return pin()["upstream"]["commit"]


def upstream_url() -> str:
    return pin()["upstream"]["repo"]


def entry_scripts() -> list[str]:
    """The entry scripts kohya-tuner launches (one per model family), in pin order."""
    return list(dict.fromkeys(pin()["scripts"].values()))


def requirement_pins() -> dict[str, str]:
    """Distribution name -> pinned version from the checkout's requirements.txt at the
    pin ("" where the file leaves the version open). Extras are dropped from the name
    so the keys compare directly with installed distributions."""
    return {re.sub(r"\[.*\]$", "", name): version for name, version in pin()["requirements"].items()}


def requirement_specs() -> list[str]:
    """The same pins as pip requirement lines, extras kept."""
    return [f"{name}=={version}" if version else name for name, version in pin()["requirements"].items()]


# ---- locating a checkout -----------------------------------------------------------


@dataclass
class Checkout:
    path: Path
    commit: str | None
    is_git: bool
    scripts: dict[str, Path]  # entry scripts found, name -> file


def _scripts_in(path: Path) -> dict[str, Path]:
    return {name: path / name for name in entry_scripts() if (path / name).is_file()}


def inspect(path: str | Path) -> Checkout:
    """Describe a directory as a checkout without judging it (no error if it holds nothing)."""
    try:
        p = Path(path).expanduser().resolve()
    except (OSError, RuntimeError):  # a symbolic link loop: Python before 3.13 raises RuntimeError
        p = Path(path).expanduser().absolute()
    is_git = (p / ".git").exists()
    return Checkout(path=p, commit=head_commit(p) if is_git else None, is_git=is_git, scripts=_scripts_in(p))


def _checkout_at(path: str | Path, origin: str) -> Checkout:
    p = Path(path).expanduser()
    if not p.exists():
        raise UserError(f"The sd-scripts folder \"{printable(str(p))}\" ({origin}) does not exist.",
                        "Run `kohya-tuner setup` to clone the pinned release, or point at an existing checkout.")
    if not p.is_dir():
        raise UserError(f"\"{printable(str(p))}\" ({origin}) is a file, not an sd-scripts folder.",
                        "Give the folder that holds train_network.py.")
    found = inspect(p)
    if not found.scripts and (p / GUI_SUBDIR).is_dir():
        # The kohya_ss GUI root: its trainer lives in the sd-scripts/ submodule.
        inner = inspect(p / GUI_SUBDIR)
        if inner.scripts:
            return inner
    if not found.scripts and (p / _GUI_MARK).is_file():
        raise UserError(
            f"\"{printable(str(p))}\" ({origin}) is a kohya_ss GUI install whose sd-scripts/ folder holds none of "
            "the entry scripts: the GUI was cloned without its submodule.",
            f"Fetch it with `git -C {shlex.quote(str(p))} submodule update --init --recursive` (the GUI's setup "
            "script does this), or give an sd-scripts checkout with --sd-scripts.",
        )
    if not found.scripts:
        raise UserError(
            f"\"{printable(str(p))}\" ({origin}) holds none of the sd-scripts entry scripts ({', '.join(entry_scripts())}).",
            "Give the sd-scripts checkout itself (or a kohya_ss install, whose sd-scripts/ folder is used).",
        )
    return found


# Where an install keeps the venv that runs its trainer (POSIX, then a Windows layout).
_VENV_PYTHONS = ("venv/bin/python", ".venv/bin/python", "venv/Scripts/python.exe", ".venv/Scripts/python.exe")
# A file at the root of every kohya_ss GUI release: its sd-scripts/ is the GUI's submodule.
_GUI_MARK = "kohya_gui.py"


@dataclass(frozen=True)
class InstallPython:
    path: Path
    where: str  # in words: whose venv it is
    broken: str | None = None  # why it cannot run (a link to nothing)


def install_python(checkout_path: str | Path) -> InstallPython | None:
    """The interpreter an install trains with: a venv inside the sd-scripts checkout (a manual
    install), else the kohya_ss GUI's venv beside its sd-scripts/ submodule. None for neither;
    a venv whose python is a link to nothing is returned with `broken` set, never skipped."""
    root = Path(checkout_path)
    places = [(root, "the venv in the sd-scripts checkout")]
    if root.name == GUI_SUBDIR and (root.parent / _GUI_MARK).is_file():
        places.append((root.parent, "the kohya_ss GUI's venv"))
    for base, where in places:
        for rel in _VENV_PYTHONS:
            cand = base / rel
            if cand.is_file():
                return InstallPython(cand, where)
            if os.path.lexists(cand):
                try:
                    target = os.readlink(cand)
                except OSError:
                    target = "something that cannot be read"
                return InstallPython(cand, where, f"{cand} is a link to {target}, which does not exist")
    return None


def default_dir() -> Path:
    return user_data_dir() / "sd-scripts"


def locate(path: str | Path | None = None) -> Checkout | None:
    """Find the checkout to use: an explicit path, else $KOHYA_SD_SCRIPTS, else the one
    `setup` clones into the data directory. None when there is none at all; a path the
    user named that is unusable is a UserError, never silently skipped."""
    if path is not None and str(path) != "":
        return _checkout_at(path, "given with --sd-scripts")
    env = os.environ.get(ENV_VAR)
    if env:
        return _checkout_at(env, f"from ${ENV_VAR}")
    found = inspect(default_dir()) if default_dir().is_dir() else None
    return found if found is not None and found.scripts else None


# ---- git ---------------------------------------------------------------------------


def _git_exe() -> str:
    exe = shutil.which("git")
    if exe is None:
        raise UserError("git is not installed or not on PATH; it is needed to clone sd-scripts.",
                        "Install git, or clone sd-scripts yourself and pass it with --sd-scripts.")
    return exe


# A query of a local checkout takes milliseconds; git blocks for good on a FIFO where it
# expects a file (.git/HEAD, a ref), so such a query is given up after this many seconds.
LOCAL_QUERY_S = 3
_STUCK: set[str] = set()  # checkouts where a query timed out: the next one would too


def _git(args: list[str], cwd: Path | None = None, *, capture: bool = True,
         timeout: float | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0", LC_ALL="C")
    # Keep inherited repository variables from redirecting every command to another repo.
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        env.pop(var, None)
    cmd = [_git_exe()] + (["-C", str(cwd)] if cwd is not None else []) + args
    if capture:
        if timeout is not None and str(cwd) in _STUCK:
            return subprocess.CompletedProcess(cmd, 124, "", "git did not answer in this checkout before")
        try:
            return subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            _STUCK.add(str(cwd))
            return subprocess.CompletedProcess(cmd, 124, "", f"git did not answer within {timeout} s")
    # Progress goes to the user's terminal on stderr; stdout stays clean for --json.
    return subprocess.run(cmd, env=env, stdout=2, stderr=None, text=True, stdin=subprocess.DEVNULL)


_SHA = re.compile(r"^[0-9a-f]{40}$")


def _small_text(path: Path, limit: int = 1 << 20) -> str:
    """A checkout file's text; a FIFO or device there raises OSError instead of blocking."""
    from kohya_tuner import safeio

    return safeio.read_regular(path, limit).decode("utf-8", "replace")


def _read_head_files(path: Path) -> str | None:
    """HEAD straight from the .git files, for when git is absent or refuses the
    repository (another owner's folder triggers git's safe.directory check)."""
    try:
        return _head_from_files(path)
    except OSError:
        return None


def _head_from_files(path: Path) -> str | None:
    gitdir = path / ".git"
    if gitdir.is_file():
        text = _small_text(gitdir).strip()
        if not text.startswith("gitdir:"):
            return None
        gitdir = (path / text[len("gitdir:"):].strip()).resolve()
    head = _small_text(gitdir / "HEAD").strip()
    if _SHA.match(head):
        return head
    if not head.startswith("ref:"):
        return None
    ref = head[4:].strip()
    roots = [gitdir]
    common = gitdir / "commondir"
    if common.is_file():
        roots.append((gitdir / _small_text(common).strip()).resolve())
    for root in roots:
        ref_file = root / ref
        if ref_file.is_file():
            value = _small_text(ref_file).strip()
            return value if _SHA.match(value) else None
        packed = root / "packed-refs"
        if packed.is_file():
            for line in _small_text(packed).splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[1] == ref and _SHA.match(parts[0]):
                    return parts[0]
    return None


def _git_can_read(path: Path) -> bool:
    """False when .git or its HEAD is a FIFO or a device, on which git would block."""
    from kohya_tuner.safeio import special_kind

    return not special_kind(path / ".git") and not special_kind(path / ".git" / "HEAD")


def head_commit(path: Path) -> str | None:
    if shutil.which("git") and _git_can_read(path):
        out = _git(["rev-parse", "--verify", "HEAD"], cwd=path, timeout=LOCAL_QUERY_S)
        if out.returncode == 0 and _SHA.match(out.stdout.strip()):
            return out.stdout.strip()
    return _read_head_files(path)


def _status(path: Path) -> tuple[list[str] | None, str]:
    """(tracked files edited in the working tree, or None when git cannot tell; why it cannot)."""
    if not shutil.which("git"):
        return None, "git is not installed"
    if not _git_can_read(path):
        return None, "its .git is not a regular file or folder"
    # A look that leaves the checkout as it was: no index refresh written back
    # (--no-optional-locks), and no fsmonitor hook from the checkout's own .git/config run.
    out = _git(["--no-optional-locks", "-c", "core.fsmonitor=false", "status", "--porcelain",
                "--untracked-files=no"], cwd=path, timeout=LOCAL_QUERY_S)
    if out.returncode != 0:
        said = (out.stderr or "").strip().splitlines()
        if any("dubious ownership" in line or "safe.directory" in line for line in said):
            return None, "git refuses a folder another user owns (its safe.directory check)"
        if out.returncode == 124:
            return None, "git did not answer"
        return None, "git could not read it" + (f" ({said[-1].strip()[:160]})" if said else "")
    return [line[3:].strip() for line in out.stdout.splitlines() if line.strip()], ""


# ---- reading add_argument calls statically -----------------------------------------


class _Source:
    """Parsed python files of one checkout, each read at most once."""

    def __init__(self, root: Path):
        self.root = root
        self._trees: dict[str, ast.Module | None] = {}
        self._imports: dict[str, dict[str, str]] = {}

    def tree(self, rel: str) -> ast.Module | None:
        if rel not in self._trees:
            file = self.root / rel
            try:
                self._trees[rel] = ast.parse(_small_text(file, 16 << 20), filename=str(file))
            except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
                # Source nested past the parser's limits is unreadable like a syntax error: unchecked.
                self._trees[rel] = None
        return self._trees[rel]

    def function(self, rel: str, name: str) -> ast.FunctionDef | None:
        tree = self.tree(rel)
        if tree is None:
            return None
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
        return None

    def imports(self, rel: str) -> dict[str, str]:
        """Local name -> dotted module (for `import a.b as c`, `from a import b`) or
        dotted module + ':' + function (for `from a.b import f`)."""
        if rel in self._imports:
            return self._imports[rel]
        tree = self.tree(rel)
        names: dict[str, str] = self._imports.setdefault(rel, {})
        if tree is None:
            return names
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    # `import a.b` binds `a`; `import a.b as c` binds `c` to a.b.
                    top = alias.name.split(".")[0]
                    names[alias.asname or top] = alias.name if alias.asname else top
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    local = alias.asname or alias.name
                    sub = f"{node.module}.{alias.name}"
                    if (self.root / (sub.replace(".", "/") + ".py")).is_file():
                        names[local] = sub
                    else:
                        names[local] = f"{node.module}:{alias.name}"
        return names


def _module_file(dotted: str) -> str:
    return dotted.replace(".", "/") + ".py"


_HELPER = re.compile(r"^(add_\w*arguments|setup_parser)$")


def _dest(call: ast.Call) -> str | None:
    for kw in call.keywords:
        if kw.arg == "dest" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
            return kw.value.value
    flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if len(flags) != len(call.args) or not flags:
        return None
    longs = [f for f in flags if f.startswith("--")]
    if longs:
        return longs[0][2:].replace("-", "_")
    return flags[0].lstrip("-").replace("-", "_")


@dataclass
class _Collected:
    always: set[str] = field(default_factory=set)
    # Added only on some call paths (inside an `if` on a helper's parameter, such as
    # the DreamBooth-only options), so compared against every script's set.
    sometimes: set[str] = field(default_factory=set)
    unreadable_adds: int = 0
    unresolved: list[str] = field(default_factory=list)  # "file:function" the walk could not read
    visited: list[str] = field(default_factory=list)


def _walk_function(src: _Source, rel: str, func: ast.FunctionDef, out: _Collected,
                   hints: dict[str, str], depth: int = 0) -> None:
    out.visited.append(f"{rel}:{func.name}")

    def visit(node: ast.AST, conditional: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            cond = conditional or isinstance(child, (ast.If, ast.IfExp))
            if isinstance(child, ast.Call):
                _call(child, conditional)
            visit(child, cond)

    def _call(call: ast.Call, conditional: bool) -> None:
        fn = call.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
        if name == "add_argument":
            dest = _dest(call)
            if dest is None:
                out.unreadable_adds += 1
            else:
                (out.sometimes if conditional else out.always).add(dest)
            return
        if name is None or not _HELPER.match(name) or depth > 8:
            return
        target = _resolve(src, rel, fn, name, hints)
        if target is None:
            out.unresolved.append(hints.get(name, f"?:{name}"))
            return
        if f"{target}:{name}" in out.visited:
            return
        node = src.function(target, name)
        if node is None:
            out.unresolved.append(f"{target}:{name}")
            return
        _walk_function(src, target, node, out, hints, depth + 1)

    visit(func, False)


def _resolve(src: _Source, rel: str, fn: ast.expr, name: str, hints: dict[str, str]) -> str | None:
    """Which file defines the helper called as `fn` from file `rel`."""
    imports = src.imports(rel)
    if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name):
        module = imports.get(fn.value.id)
        if module and ":" not in module:
            return _module_file(module)
    elif isinstance(fn, ast.Name):
        if src.function(rel, name) is not None:
            return rel
        imported = imports.get(name)
        if imported and ":" in imported:
            return _module_file(imported.split(":")[0])
    # The pin's own record of where this helper lives.
    if name in hints:
        return hints[name].split(":")[0]
    return None


def static_arguments(root: Path, script: str) -> _Collected:
    """Every `add_argument` dest reachable from `script`'s setup_parser(), read with ast."""
    src = _Source(root)
    out = _Collected()
    hints = _chain_hints(script)
    func = src.function(script, "setup_parser")
    if func is None:
        out.unresolved.append(f"{script}:setup_parser")
        return out
    _walk_function(src, script, func, out, hints)
    return out


def _chain_hints(script: str) -> dict[str, str]:
    chain = schema.raw_schema()["scripts"].get(script, {}).get("setup_parser_chain", [])
    return {link.split(":")[1]: link for link in chain if not link.endswith(":setup_parser")}


# ---- verifying ---------------------------------------------------------------------


@dataclass
class PinReport:
    path: str
    matches: bool  # exactly the pinned commit, every entry script present, no local edits
    commit: str | None
    pinned_commit: str
    missing_scripts: list[str]
    differences: list[str]  # "added: --foo", "removed: --bar (in flux_train_network.py)"
    checked_by: str  # "commit" or "arguments"
    unchecked: list[str] = field(default_factory=list)  # helpers that could not be read
    local_changes: list[str] = field(default_factory=list)
    # Why the work tree of a git checkout could not be compared with its commit ("" when it was):
    # then the commit alone proves nothing, and the arguments are read from the files.
    changes_unknown: str = ""

    @property
    def compatible(self) -> bool:
        """Same entry scripts and argument set as the pin, whatever the commit."""
        return not self.missing_scripts and not self.differences

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["compatible"] = self.compatible
        return data


def _script_baseline(script: str) -> dict[str, str]:
    return {a["name"]: a.get("source", "") for a in schema.raw_schema()["scripts"][script]["args"]}


@lru_cache(maxsize=None)
def _all_known_args() -> frozenset[str]:
    return frozenset(a["name"] for s in schema.raw_schema()["scripts"].values() for a in s["args"])


def compare_arguments(root: Path, scripts: list[str]) -> tuple[list[str], list[str]]:
    """(differences, unchecked) between the checkout's argument set and args.json."""
    found: dict[tuple[str, str], list[str]] = {}
    unchecked: list[str] = []
    for script in scripts:
        got = static_arguments(root, script)
        base = _script_baseline(script)
        blind = {link.split(":")[-1] for link in got.unresolved}
        unchecked.extend(link for link in got.unresolved if link not in unchecked)
        if got.unreadable_adds:
            unchecked.append(f"{script}: {got.unreadable_adds} add_argument call(s) with computed names")
        if f"{script}:setup_parser" in got.unresolved:
            continue  # nothing of this script could be read, so nothing can be called removed
        added = (got.always - set(base)) | (got.sometimes - set(base) - _all_known_args())
        removed = {name for name, source in base.items()
                   if name not in got.always | got.sometimes and source.split(":")[-1] not in blind}
        for name in added:
            found.setdefault(("added", name), []).append(script)
        for name in removed:
            found.setdefault(("removed", name), []).append(script)
    lines = []
    for (kind, name), where in sorted(found.items()):
        suffix = "" if len(where) == len(scripts) else f" (in {', '.join(where)})"
        lines.append(f"{kind}: --{name}{suffix}")
    return lines, unchecked


def verify(checkout: Checkout) -> PinReport:
    """Compare a checkout with the pin. Pure read: never imports or runs the checkout."""
    pinned = pinned_commit()
    present = [s for s in entry_scripts() if s in checkout.scripts]
    missing = [s for s in entry_scripts() if s not in checkout.scripts]
    found, unknown = _status(checkout.path) if checkout.is_git else ([], "")
    changes = found or []
    at_pin = checkout.commit == pinned
    differences: list[str] = []
    unchecked: list[str] = []
    checked_by = "commit"
    if not at_pin or unknown or any(c.endswith(".py") for c in changes):
        checked_by = "arguments"
        differences, unchecked = compare_arguments(checkout.path, present)
    return PinReport(
        path=str(checkout.path),
        matches=at_pin and not missing and not changes and not unknown,
        commit=checkout.commit,
        pinned_commit=pinned,
        missing_scripts=missing,
        differences=differences,
        checked_by=checked_by,
        unchecked=unchecked,
        local_changes=changes,
        changes_unknown=unknown,
    )


# ---- cloning -----------------------------------------------------------------------


@dataclass
class SetupResult:
    checkout: Checkout
    action: str  # "cloned", "already at the pin", "moved to the pin"


def _same_repo(a: str, b: str) -> bool:
    def norm(u: str) -> str:
        u = u.strip().rstrip("/")
        u = re.sub(r"\.git$", "", u)
        u = re.sub(r"^(https?|ssh|git)://(git@)?", "", u)
        u = re.sub(r"^git@([^:]+):", r"\1/", u)
        return u.lower()

    if os.path.isdir(a) and os.path.isdir(b):
        return os.path.samefile(a, b)
    return norm(a) == norm(b)


def _has_commit(path: Path, commit: str) -> bool:
    return _git(["cat-file", "-e", f"{commit}^{{commit}}"], cwd=path, timeout=LOCAL_QUERY_S).returncode == 0


def _is_remote(url: str) -> bool:
    if "://" in url:
        return not url.startswith("file://")
    return re.match(r"^[\w.-]+@[\w.-]+:", url) is not None  # scp-like ssh address


def _shown_url(url: str) -> str:
    from kohya_tuner.redact import url_credentials

    return url_credentials(url)


def _fail(what: str, proc: subprocess.CompletedProcess, hint: str | None = None) -> UserError:
    from kohya_tuner.redact import url_credentials

    detail = (proc.stderr or "").strip().splitlines()
    tail = f" git said: {detail[-1]}" if detail else ""
    # A --repo-url may carry a password or token: git hides it in its own words, and so do we.
    return UserError(url_credentials(f"{what}.{tail}"), hint)


def _update_existing(dest: Path, url: str, commit: str, progress: bool) -> SetupResult:
    if not (dest / ".git").exists():
        raise UserError(
            f"\"{printable(str(dest))}\" is not empty and is not a git checkout, so setup will not clone into it.",
            "Choose an empty or new folder with --dir, or verify an existing sd-scripts folder with --sd-scripts.",
        )
    head = head_commit(dest)
    if head == commit:
        return SetupResult(inspect(dest), "already at the pin")
    origin = _git(["remote", "get-url", "origin"], cwd=dest, timeout=LOCAL_QUERY_S)
    is_ours = (origin.returncode == 0 and _same_repo(origin.stdout.strip(), url)) or _has_commit(dest, commit)
    if not is_ours:
        raise UserError(
            f"\"{printable(str(dest))}\" is a git checkout of another repository, so setup leaves it alone.",
            "Choose an empty or new folder with --dir.",
        )
    changes, _why = _status(dest)
    if changes:
        raise UserError(
            f"\"{printable(str(dest))}\" has local changes ({', '.join(changes[:5])}); setup will not move it to the pinned commit.",
            "Commit or stash them yourself, or use the checkout as it is with --sd-scripts.",
        )
    if not _has_commit(dest, commit):
        fetched = _git(["fetch", "--quiet", url], cwd=dest, capture=not progress)
        if fetched.returncode != 0 or not _has_commit(dest, commit):
            raise _fail(f"Could not fetch commit {commit[:12]} into \"{printable(str(dest))}\" from {url}", fetched)
    moved = _git(["checkout", "--quiet", "--detach", commit], cwd=dest)
    if moved.returncode != 0:
        raise _fail(f"git refused to check out {commit[:12]} in \"{printable(str(dest))}\"", moved)
    return SetupResult(inspect(dest), "moved to the pin")


def setup_checkout(dest: Path | str | None = None, *, repo_url: str | None = None,
                   progress: bool = False) -> SetupResult:
    """Clone the pinned commit into `dest` (default: the data directory), or bring an
    existing clone of the same repository to it. Never touches a folder that is not
    that repository, and never discards local edits."""
    target = Path(dest).expanduser() if dest else default_dir()
    url = repo_url or upstream_url()
    commit = pinned_commit()
    _git_exe()
    if target.exists() and not target.is_dir():
        raise UserError(f"\"{printable(str(target))}\" is a file; setup needs a folder to clone sd-scripts into.")
    if target.is_dir() and any(target.iterdir()):
        return _update_existing(target, url, commit, progress)

    target.parent.mkdir(parents=True, exist_ok=True)
    # Clone beside the target and rename at the end, so an interrupted clone never
    # leaves a half-filled folder that `locate` would pick up.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-clone-", dir=target.parent))
    try:
        args = ["clone", "--no-checkout"]
        if _is_remote(url):
            args.append("--filter=blob:none")  # only the pinned tree's files are downloaded
        if not progress:
            args.append("--quiet")
        cloned = _git(args + [url, str(staging)], capture=not progress)
        if cloned.returncode != 0:
            raise _fail(f"git could not clone {url}", cloned, "Check the address and your connection.")
        if not _has_commit(staging, commit):
            raise UserError(f"{_shown_url(url)} does not contain the pinned sd-scripts commit {commit}.",
                            "Clone from the upstream repository or a mirror that has it.")
        checked = _git(["checkout", "--quiet", "--detach", commit], cwd=staging, capture=True)
        if checked.returncode != 0:
            raise _fail(f"git could not check out {commit[:12]}", checked)
        if target.is_dir():
            target.rmdir()  # empty, checked above
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return SetupResult(inspect(target), "cloned")


def setup(dest: Path | str | None = None, *, repo_url: str | None = None, progress: bool = False) -> Checkout:
    return setup_checkout(dest, repo_url=repo_url, progress=progress).checkout


# ---- trainer requirements ----------------------------------------------------------


def requirements_command(checkout: Checkout, python: str | None = None) -> list[str]:
    """The pip command that installs the checkout's requirements. It runs from inside
    the checkout because requirements.txt ends with `-e .`."""
    req = pin()["environment"]["requirements_file"]
    return [python or trainer_python(checkout), "-m", "pip", "install", "-r", req]


def trainer_python(checkout: Checkout) -> str:
    """The interpreter `run`, `doctor` and `setup` use when --python is not given."""
    found = install_python(checkout.path)
    return str(found.path) if found is not None else sys.executable


def install_requirements(checkout: Checkout, python: str | None = None) -> int:
    """Run pip for the trainer environment (only on the user's explicit request).
    pip's own output goes to stderr so a --json caller's stdout stays one object."""
    req = checkout.path / pin()["environment"]["requirements_file"]
    if not req.is_file():
        raise UserError(f"\"{printable(str(checkout.path))}\" has no {req.name}; cannot install sd-scripts' requirements.")
    exe = python or trainer_python(checkout)
    if not (shutil.which(exe) or Path(exe).is_file()):
        raise UserError(f"Python interpreter {exe!r} not found.", "Pass the trainer environment's python with --python.")
    proc = subprocess.run(requirements_command(checkout, exe), cwd=checkout.path, stdout=2,
                          stdin=subprocess.DEVNULL)
    return proc.returncode
